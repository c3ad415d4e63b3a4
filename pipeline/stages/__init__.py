"""The `pal` commands that DVC's stages run (demo, prepare, tune, extract) and
the ones a user runs beside them (check, predict, backbone); `resume` keeps an
interrupted stage's finished steps."""
