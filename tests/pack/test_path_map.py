"""``dlfs pack --map``: a CSV or TSV of (source path, tree path) places members where training code
expects them, from every kind of source, in place too; members it does not name stay where they
are; a map that is unsafe or ambiguous is refused in one line before anything is published."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from commands import TOOLS, assert_one_line_error, dlfs, tool
from mounts import mounted

from dlfs.core import format as fmt

#: The class of each flat validation image, as the devkit's ground truth gives it.
LABELS = ["n01440764", "n01443537", "n01440764", "n01484850", "n01443537", "n01440764"]


def val_name(number: int) -> str:
    return f"ILSVRC2012_val_{number:08d}.JPEG"


def image(number: int) -> bytes:
    return f"jpeg {number} ".encode() * (number * 50)


def flat_val(root: Path) -> Path:
    """``root/val/`` holding the flat validation images, and a ``labels.csv`` beside it."""
    (root / "val").mkdir(parents=True)
    for number in range(1, len(LABELS) + 1):
        (root / "val" / val_name(number)).write_bytes(image(number))
    (root / "labels.csv").write_text("".join(f"{val_name(n)},{w}\n" for n, w in enumerate(LABELS, 1)))
    return root


def val_map(path: Path, delimiter: str = ",") -> Path:
    """The map a user writes from the labels: ``val/NAME`` into ``val/<wnid>/NAME``."""
    lines = [
        f"{delimiter.join((f'val/{val_name(n)}', f'val/{w}/{val_name(n)}'))}\n"
        for n, w in enumerate(LABELS, 1)
    ]
    path.write_text("# source path, tree path\n\n" + "".join(lines))
    return path


def expected_tree() -> dict[str, bytes]:
    files = {f"val/{w}/{val_name(n)}": image(n) for n, w in enumerate(LABELS, 1)}
    files["labels.csv"] = "".join(f"{val_name(n)},{w}\n" for n, w in enumerate(LABELS, 1)).encode()
    return files


def files_under(root: Path) -> dict[str, bytes]:
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def run(*args: str | Path) -> None:
    subprocess.run([*map(str, args)], check=True, timeout=60, capture_output=True)


def source(kind: str, tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """The flat validation set as ``kind`` of source, and the flags that pack it."""
    src = flat_val(tmp_path / "src")
    tar = tmp_path / "val.tar"
    if kind == "tree":
        return src, ()
    if kind in ("tar", "in-place"):
        run("tar", "--format=pax", "-cf", tar, "-C", src, "val", "labels.csv")
        return tar, ("--in-place",) if kind == "in-place" else ()
    if kind == "tar.gz":
        run("tar", "--format=gnu", "-czf", tmp_path / "val.tar.gz", "-C", src, "val", "labels.csv")
        return tmp_path / "val.tar.gz", ()
    if kind == "zip":
        subprocess.run(
            ["zip", "-qr", tmp_path / "val.zip", "val", "labels.csv"], cwd=src, check=True, timeout=60
        )
        return tmp_path / "val.zip", ()
    # The images in a tar of their own, inside the tar: --expand-tars makes it the folder val/.
    run("tar", "-cf", src / "val.tar", "-C", src / "val", *sorted(os.listdir(src / "val")))
    run("tar", "-cf", tar, "-C", src, "val.tar", "labels.csv")
    return tar, ("--expand-tars", "--in-place") if kind == "expand-tars-in-place" else ("--expand-tars",)


@pytest.mark.parametrize(
    "kind", ["tree", "tar", "tar.gz", "zip", "expand-tars", "in-place", "expand-tars-in-place"]
)
def test_the_map_places_members_from_every_kind_of_source(tmp_path: Path, kind: str) -> None:
    src, flags = source(kind, tmp_path)
    dst = tmp_path / "dst"
    result = dlfs("pack", src, dst, "--map", val_map(tmp_path / "map.csv"), "--json", *flags)
    summary = json.loads(result.stdout)
    assert (summary["mapped"], summary["unmapped"], summary["map_unused"]) == (len(LABELS), 1, 0)
    if "in-place" in kind:
        assert sorted(p.name for p in dst.iterdir()) == [fmt.INDEX_NAME]
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert files_under(mnt) == expected_tree()
        assert sorted(p.name for p in (mnt / "val").iterdir()) == sorted(set(LABELS))
        assert oct((mnt / "val" / LABELS[0]).stat().st_mode & 0o7777) == oct(0o755)


def test_in_place_from_a_folder_of_tars_the_map_names_members_under_each_tars_folder(tmp_path: Path) -> None:
    """A folder of WebDataset-like shards: ``val.tar`` becomes the folder ``val``, so its members are
    ``val/NAME`` to the map, and are served in place from their new paths."""
    src = flat_val(tmp_path / "src")
    shards = tmp_path / "shards"
    shards.mkdir()
    run("tar", "-cf", shards / "val.tar", "-C", src / "val", *sorted(os.listdir(src / "val")))
    dst = tmp_path / "dst"
    result = dlfs("pack", "--in-place", shards, dst, "--map", val_map(tmp_path / "map.csv"), "--json")
    assert json.loads(result.stdout)["mapped"] == len(LABELS)
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert files_under(mnt) == {
            path: data for path, data in expected_tree().items() if path != "labels.csv"
        }


def test_a_flat_val_tar_and_the_devkit_map_make_an_image_folder(tmp_path: Path) -> None:
    """ImageNet's layout: the images at the tar's root (here as ``./NAME``), classes given by id in
    the devkit's ground truth, ids not in wnid order; the tool writes the map, and the real
    torchvision ImageFolder finds the classes and their images on the mount."""
    from torchvision import datasets

    src = flat_val(tmp_path / "src")
    tar = tmp_path / "ILSVRC2012_img_val.tar"
    run("tar", "-cf", tar, "-C", src / "val", ".")
    wnids = sorted(set(LABELS) | {f"n{k:08d}" for k in range(1000 - len(set(LABELS)))}, reverse=True)
    (tmp_path / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (tmp_path / "truth.txt").write_text("".join(f"{wnids.index(w) + 1}\n" for w in LABELS))
    made = tool(TOOLS / "imagenet_val_map.py", tmp_path / "truth.txt", "--wnids", tmp_path / "wnids.txt")
    (tmp_path / "val.csv").write_text(made.stdout)
    dst = tmp_path / "dst"
    dlfs("pack", tar, dst, "--map", tmp_path / "val.csv")
    with mounted(dst, tmp_path / "mnt") as mnt:
        dataset = datasets.ImageFolder(str(mnt))
        assert dataset.classes == sorted(set(LABELS))
        counts = {name: dataset.targets.count(k) for name, k in dataset.class_to_idx.items()}
        assert counts == {wnid: LABELS.count(wnid) for wnid in set(LABELS)}
        for path, target in dataset.samples:
            number = int(Path(path).stem.rpartition("_")[2])
            assert Path(path).read_bytes() == image(number)
            assert dataset.classes[target] == LABELS[number - 1]


def test_a_flat_folder_with_labels_csv_packs_into_class_folders(tmp_path: Path) -> None:
    """A map written from the folder's own labels.csv; the file not named (the labels) stays, and
    an entry naming no member is counted and warned of."""
    src = flat_val(tmp_path / "src")
    labels = (src / "labels.csv").read_text().splitlines()
    entries = [f"val/{name},train/{wnid}/{name}" for name, wnid in (line.split(",") for line in labels)]
    (tmp_path / "map.csv").write_text("\n".join([*entries, "val/missing.JPEG,train/x/missing.JPEG"]) + "\n")
    dst = tmp_path / "dst"
    result = dlfs("pack", src, dst, "--map", tmp_path / "map.csv")
    assert f"--map moved {len(LABELS)} files and links, left 1 where they were" in result.stdout
    assert "1 of its entries named no member" in result.stdout
    assert "1 map entries named no member, e.g. val/missing.JPEG" in result.stderr
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert sorted(p.name for p in mnt.iterdir()) == ["labels.csv", "train", "val"]
        assert list((mnt / "val").iterdir()) == []
        assert {w: len(list((mnt / "train" / w).iterdir())) for w in set(LABELS)} == {
            w: LABELS.count(w) for w in set(LABELS)
        }


@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_quoted_names_may_hold_the_delimiter_in_csv_and_tsv(tmp_path: Path, delimiter: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / f"a{delimiter}b.txt").write_bytes(b"odd")
    (tmp_path / "map").write_text(f'"a{delimiter}b.txt"{delimiter}"c{delimiter}d/e.txt"\n')
    dst = tmp_path / "dst"
    dlfs("pack", src, dst, "--map", tmp_path / "map")
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert files_under(mnt) == {f"c{delimiter}d/e.txt": b"odd"}


def test_a_hard_link_follows_its_target_where_the_map_moves_it(tmp_path: Path) -> None:
    src = flat_val(tmp_path / "src")
    os.link(src / "val" / val_name(1), src / "first.JPEG")
    tar = tmp_path / "val.tar"
    run("tar", "--format=gnu", "-cf", tar, "-C", src, "val", "first.JPEG", "labels.csv")
    dst = tmp_path / "dst"
    dlfs("pack", tar, dst, "--map", val_map(tmp_path / "map.csv"))
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "first.JPEG").read_bytes() == image(1)
        moved = mnt / "val" / LABELS[0] / val_name(1)
        assert (mnt / "first.JPEG").stat().st_ino == moved.stat().st_ino
        assert (mnt / "first.JPEG").stat().st_nlink == 2


#: Maps refused in one line (over the flat validation tar), and the words the line must hold.
BAD_MAPS = {
    "climbing target": (f"val/{val_name(1)},../x\n", ("map.csv, line 1", "'..'")),
    "absolute target": (f"val/{val_name(1)},/etc/x\n", ("line 1", "not a plain relative path")),
    "empty component": (f"val/{val_name(1)},a//x\n", ("line 1", "not a plain relative path")),
    "empty target": (f"val/{val_name(1)},\n", ("line 1", "not a plain relative path")),
    "one field": (f"# comment\nval/{val_name(1)}\n", ("line 2", "two are wanted")),
    "source twice": (f"val/{val_name(1)},a\n./val/{val_name(1)},b\n", ("line 2", "mapped already on line 1")),
    "target twice": (f"val/{val_name(1)},a\nval/{val_name(2)},a\n", ("line 2", "where line 1 places")),
    "onto a member that stays": (f"val/{val_name(1)},val/{val_name(2)}\n", ("line 1", "does not move")),
    "a folder": ("val,images\n", ("line 1", "is a folder")),
    "below a file": (
        f"val/{val_name(1)},labels.csv/x\n",
        ("labels.csv", "both a folder and a file", "--map"),
    ),
}


@pytest.mark.parametrize("kind", ["tree", "tar"])
@pytest.mark.parametrize("case", list(BAD_MAPS))
def test_a_bad_map_is_refused_in_one_line_with_nothing_published(
    tmp_path: Path, kind: str, case: str
) -> None:
    text, fragments = BAD_MAPS[case]
    (tmp_path / "map.csv").write_text(text)
    src, _ = source(kind, tmp_path)
    dst = tmp_path / "dst"
    assert_one_line_error(dlfs("pack", src, dst, "--map", tmp_path / "map.csv", check=False), *fragments)
    assert not (dst / fmt.INDEX_NAME).exists()


def test_a_moved_symlink_keeps_its_target_text(tmp_path: Path) -> None:
    """Wherever it lands, and whatever its target then names (here: outside the tree)."""
    src = flat_val(tmp_path / "src")
    (src / "val" / "link").symlink_to("../labels.csv")
    tar = tmp_path / "val.tar"
    run("tar", "-cf", tar, "-C", src, "val", "labels.csv")
    (tmp_path / "map.csv").write_text("val/link,top-link\n")
    dlfs("pack", tar, tmp_path / "dst", "--map", tmp_path / "map.csv")
    with mounted(tmp_path / "dst", tmp_path / "mnt") as mnt:
        assert os.readlink(mnt / "top-link") == "../labels.csv"
