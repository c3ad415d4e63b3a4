"""The paper's results as DVC experiment grids, and their tables (`pal-paper`)."""
