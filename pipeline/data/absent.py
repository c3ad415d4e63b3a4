"""Naturally absent modalities: image files that are not there or do not
decode, empty texts, and what `data.absent` does with them (DESIGN §6).

`natural_codes` gives each listed sample its natural missing-modality code
(`palcore.codes.Missing`) before the protocol's table is applied
(`pipeline.stages.prepare`); `scan_images` decodes every listed image once and
digests their bytes, which is how later stages depend on the images' content.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
from pathlib import Path

from palcore.codes import Missing
from pipeline.data.datasets import DatasetError, FileIndex, Listing, RawSample
from pipeline.params import DataParams

log = logging.getLogger(__name__)

FIRST_IDS = 5  # ids quoted in absent-modality reports


@dataclasses.dataclass
class _Absent:
    ids: list[str] = dataclasses.field(default_factory=list)

    def report(self) -> dict:
        return {"count": len(self.ids), "first_ids": sorted(self.ids)[:FIRST_IDS]}


def unreadable_images(
    root: Path, rels: list[str], workers: int | None = None
) -> list[str]:
    """The files of `rels` (paths under `root`) that do not decode as images,
    in the order given (`scan_images`' first half)."""
    return scan_images(root, rels, workers)[0]


def scan_images(
    root: Path, rels: list[str], workers: int | None = None
) -> tuple[list[str], str]:
    """(the files of `rels` that do not decode, in the order given; the
    sha256 of every file's bytes, by path). JPEGs decode at 1/8 scale (a
    truncated or foreign file still fails), in `workers` threads (default:
    one per core), with a progress bar. The digest is what tune and extract
    depend on through tasks.json: the images' content, not their folder."""
    if not rels:
        return [], hashlib.sha256().hexdigest()
    from concurrent.futures import ThreadPoolExecutor

    from palcore.progress import tqdm

    def scan(rel: str) -> tuple[bool, str]:
        from PIL import Image

        try:
            blob = (root / rel).read_bytes()
        except OSError:
            return True, ""
        try:
            with Image.open(io.BytesIO(blob)) as im:
                if im.format == "JPEG":
                    im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
                im.load()
        except Exception:  # OSError, SyntaxError, DecompressionBombError…
            return True, hashlib.sha256(blob).hexdigest()
        return False, hashlib.sha256(blob).hexdigest()

    workers = workers or min(16, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        results = list(
            tqdm(
                pool.map(scan, rels),
                total=len(rels),
                desc="prepare: images",
                unit="image",
                disable=None,
                leave=False,
            )
        )
    digest = hashlib.sha256()
    for rel, (_, file_hash) in zip(rels, results, strict=True):
        digest.update(f"{rel}\0{file_hash}\n".encode())
    bad = [rel for rel, (flag, _) in zip(rels, results, strict=True) if flag]
    return bad, digest.hexdigest()


def natural_codes(listing: Listing, params: DataParams) -> tuple[list, dict, str]:
    """Resolve absent images and texts per `data.absent`; an image file that
    does not decode counts as absent too (`unreadable`).

    Returns:
        (kept, report, images): kept is a list of (RawSample, natural code,
        image or None, text), report the `absent` entry of tasks.json and
        images the sha256 of the image files' bytes (`scan_images`).
    """
    index = FileIndex(listing.root)
    on_disk = [s.image for s in listing.samples if s.image and index.exists(s.image)]
    unreadable, content = scan_images(listing.root, on_disk)
    bad = set(unreadable)
    kept, absent = _sort_by_modality(listing, index, bad)
    if bad and params.absent == "reject":
        names = ", ".join(sorted(bad))
        raise DatasetError(
            f"{listing.root}: {len(bad)} image file{'s' * (len(bad) != 1)} do"
            f"{'es' * (len(bad) == 1)} not decode: {names}; set data.absent: "
            "missing to keep those samples with the image missing"
        )
    report = {k: v.report() for k, v in absent.items()}
    _announce_absent(report, listing, params)
    return kept, report, content


def _sort_by_modality(
    listing: Listing, index: FileIndex, bad: set[str]
) -> tuple[list, dict[str, _Absent]]:
    """(kept, absent): each sample with its natural code, image and text
    (one lacking both is dropped), and the ids lacking each modality."""
    absent = {kind: _Absent() for kind in ("image", "text", "both", "unreadable")}
    kept: list[tuple[RawSample, Missing, str | None, str | None]] = []
    for s in listing.samples:
        on_file = s.image is not None and index.exists(s.image)
        unreadable = on_file and s.image in bad
        has_image = on_file and not unreadable
        has_text = s.text is not None and s.text.strip() != ""
        if not has_image and not has_text:
            absent["both"].ids.append(s.id)
            continue
        if not has_image:
            absent["unreadable" if unreadable else "image"].ids.append(s.id)
            kept.append((s, Missing.IMAGE, None, s.text))
        elif not has_text:
            absent["text"].ids.append(s.id)
            kept.append((s, Missing.TEXT, s.image, ""))
        else:
            kept.append((s, Missing.COMPLETE, s.image, s.text))
    return kept, absent


def _announce_absent(report: dict, listing: Listing, params: DataParams) -> None:
    """One warning per kind of absent modality, or with `data.absent: reject`
    an error naming the first samples (unreadable files are rejected above)."""
    for kind, what, then in (
        ("unreadable", "an image file that does not decode", "keep them"),
        ("image", "no image file", "keep them"),
        ("text", "no text", "keep them"),
        ("both", "neither image nor text", "drop them"),
    ):
        r = report[kind]
        if not r["count"]:
            continue
        first = ", ".join(r["first_ids"])
        n = r["count"]
        samples = f"{n} sample{'s' * (n != 1)} {'has' if n == 1 else 'have'}"
        if params.absent == "reject" and kind != "unreadable":
            raise DatasetError(
                f"{listing.root}: {samples} {what} (first: {first}); "
                f"set data.absent: missing to {then}"
            )
        if kind == "unreadable":
            log.warning(
                "%s %s, kept with the image missing (first: %s)", samples, what, first
            )
        elif kind == "both":
            log.warning(
                "dropping %s neither image nor text (first: %s)",
                samples.replace(" has", " with").replace(" have", " with"),
                first,
            )
        else:
            log.warning(
                "%s %s, kept with that modality missing (first: %s)",
                samples,
                what,
                first,
            )
