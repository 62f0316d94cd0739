"""The drop-in sampler with the real torchvision ImageFolder and a multi-worker DataLoader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from commands import dlfs
from mounts import mount_stats
from PIL import Image
from seaweed import free_ports
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from dlfs.core.fileset import KEEP_SETS, FileSet
from dlfs.torch import NotOnDlfsError, ShuffleSampler

CLASSES, PER_CLASS = 6, 40
RANK_PROCESS = Path(__file__).with_name("ddp_rank.py")


def _colour(sample_id: int) -> tuple[int, int, int]:
    """A colour that survives JPEG and identifies the sample (16 levels per channel)."""
    return ((sample_id % 16) * 16 + 8, (sample_id // 16 % 16) * 16 + 8, (sample_id // 256) * 16 + 8)


def _sample_id(pixels: torch.Tensor) -> int:
    r, g, b = (round(float(channel.mean()) * 255) // 16 for channel in pixels)
    return r + 16 * g + 256 * b


@pytest.fixture(scope="module")
def jpeg_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """Real JPEGs in ImageNet-style class folders, packed; returns (dataset, relative path -> id)."""
    root = tmp_path_factory.mktemp("jpegs")
    ids = {}
    for c in range(CLASSES):
        for k in range(PER_CLASS):
            sample_id = c * PER_CLASS + k
            relative = f"n{c:08d}/n{c:08d}_{k}.JPEG"
            (root / "src" / relative).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (16, 16), _colour(sample_id)).save(root / "src" / relative, quality=95)
            ids[relative] = sample_id
    dlfs("pack", root / "src", root / "dataset", "--placement", "random", "--seed", "1")
    return root / "dataset", ids


def _published(mnt: Path, name: str) -> list[str]:
    return (mnt / ".dlfs" / "order" / name).read_text().splitlines()


def _epoch(loader: DataLoader) -> list[int]:
    delivered = []
    for images, _ in loader:
        delivered.extend(_sample_id(image) for image in images)
    return delivered


def test_dataloader_delivers_each_sample_once_in_the_published_order(jpeg_dataset, mount) -> None:
    dataset_dir, ids = jpeg_dataset
    with mount(dataset_dir, "--seed", "7") as mnt:
        mnt = Path(mnt)
        dataset = datasets.ImageFolder(str(mnt), transform=transforms.ToTensor())
        assert len(dataset.classes) == CLASSES
        sampler = ShuffleSampler(dataset)
        loader = DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=2)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            delivered = _epoch(loader)
            expected = [ids[path] for path in _published(mnt, f"epoch-{epoch}")]
            assert delivered == expected
            assert sorted(delivered) == list(range(CLASSES * PER_CLASS))
        assert _epoch_order(sampler, 0) != _epoch_order(sampler, 1)


def _epoch_order(sampler: ShuffleSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_distributed_ranks_split_the_epoch_like_distributed_sampler(jpeg_dataset, mount) -> None:
    dataset_dir, _ = jpeg_dataset
    with mount(dataset_dir) as mnt:
        dataset = datasets.ImageFolder(str(mnt))
        world = 7
        shares = []
        for rank in range(world):
            sampler = ShuffleSampler(dataset, num_replicas=world, rank=rank)
            sampler.set_epoch(3)
            shares.append(list(sampler))
        total = CLASSES * PER_CLASS
        assert {len(share) for share in shares} == {-(-total // world)}
        combined = np.concatenate(shares)
        assert set(combined.tolist()) == set(range(total))
        assert combined.size - np.unique(combined).size == -(-total // world) * world - total
        stats = (Path(mnt) / ".dlfs" / "stats").read_text()
        assert all(f"epoch-3.rank-{rank}-of-{world}" in stats for rank in range(world))


def test_sampler_follows_the_order_for_a_dataset_holding_part_of_the_mount(jpeg_dataset, mount) -> None:
    dataset_dir, _ = jpeg_dataset
    with mount(dataset_dir) as mnt:
        sub = Path(mnt) / f"n{0:08d}"
        # A dataset that holds only some of the mount's files: the order is made over them.
        dataset = datasets.ImageFolder(
            str(mnt), is_valid_file=lambda p: os.path.dirname(p) == str(sub), allow_empty=True
        )
        sampler = ShuffleSampler(dataset)
        indices = list(sampler)
        assert sorted(indices) == list(range(PER_CLASS))
        published = sampler.order_path().read_text().splitlines()
        assert [dataset.samples[k][0] for k in indices] == [str(Path(mnt) / line) for line in published]


def _train_beside_val(root: Path) -> Path:
    """ImageNet's layout: ``train/`` and ``val/`` class folders side by side, with a stray
    ``Thumbs.db`` that ImageFolder's extension filter skips."""
    for part, classes, per_class in (("train", 5, 41), ("val", 5, 13)):
        for c in range(classes):
            folder = root / part / f"n{c:08d}"
            folder.mkdir(parents=True)
            for k in range(per_class):
                (folder / f"n{c:08d}_{k}.JPEG").write_bytes(b"%d/%d/%d" % (c, k, len(part)))
    (root / "train" / f"n{2:08d}" / "Thumbs.db").write_bytes(b"stray")
    return root


@pytest.fixture(scope="module")
def train_and_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train-val")
    dlfs("pack", _train_beside_val(root / "src"), root / "dataset")
    return root / "dataset"


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_gets_an_equal_share_of_a_dataset_rooted_beside_another(
    train_and_val: Path, mount, drop_last: bool
) -> None:
    """train/ beside val/, a stray file, both datasets read at once: DistributedSampler's counts
    for each, their union is exactly the dataset, and the read-ahead follows each rank's share."""
    with mount(train_and_val) as mnt:
        mnt = Path(mnt)
        for world in (2, 3, 8):
            for part in ("train", "val"):
                dataset = datasets.ImageFolder(str(mnt / part))
                size = len(dataset)
                samplers = [
                    ShuffleSampler(dataset, num_replicas=world, rank=rank, drop_last=drop_last)
                    for rank in range(world)
                ]
                shares = [list(sampler) for sampler in samplers]
                per_rank = size // world if drop_last else -(-size // world)
                assert [len(share) for share in shares] == [per_rank] * world
                assert [len(sampler) for sampler in samplers] == [per_rank] * world
                combined = [k for share in shares for k in share]
                if drop_last:
                    assert len(set(combined)) == len(combined) == per_rank * world
                else:
                    assert set(combined) == set(range(size))
                readings = mount_stats(mnt)["readahead"]["readings"]
                for sampler, share in zip(samplers, shares, strict=True):
                    published = sampler.order_path().read_text().splitlines()
                    assert [dataset.samples[k][0] for k in share] == [str(mnt / line) for line in published]
                    assert readings[sampler.order_path().name]["files"] == per_rank


def test_seed_and_drop_last_are_the_samplers_and_the_mount_flag_only_the_default(
    train_and_val: Path, mount
) -> None:
    with mount(train_and_val, "--seed", "3") as first, mount(train_and_val, "--seed", "4") as second:
        orders = {}
        for name, mnt in (("first", first), ("second", second)):
            dataset = datasets.ImageFolder(str(Path(mnt) / "train"))
            orders[name, "default"] = list(ShuffleSampler(dataset))
            orders[name, "seed 9"] = list(ShuffleSampler(dataset, seed=9))
            orders[name, "mount's"] = list(ShuffleSampler(dataset, seed=3 if name == "first" else 4))
        assert orders["first", "seed 9"] == orders["second", "seed 9"]
        assert orders["first", "default"] != orders["second", "default"]
        assert orders["first", "default"] == orders["first", "mount's"]
        assert orders["second", "default"] == orders["second", "mount's"]
        assert orders["first", "seed 9"] != orders["first", "default"]
        size = len(orders["first", "default"])
        dropped = ShuffleSampler(datasets.ImageFolder(str(Path(first) / "train")), 3, 1, drop_last=True)
        assert len(list(dropped)) == size // 3


def test_a_sampler_tells_a_mount_that_forgot_its_set_again(train_and_val: Path, mount) -> None:
    with mount(train_and_val) as mnt:
        dataset = datasets.ImageFolder(str(Path(mnt) / "train"))
        sampler = ShuffleSampler(dataset, num_replicas=2, rank=1)
        first = list(sampler)
        for start in range(1, KEEP_SETS + 2):
            for name in FileSet(np.arange(start, 100)).announcements():
                (Path(mnt) / ".dlfs" / "set" / name).exists()
        assert not (Path(mnt) / ".dlfs" / "set" / sampler.digest).exists()
        sampler.set_epoch(1)
        second = list(sampler)
        assert len(second) == len(first) and second != first
        assert (Path(mnt) / ".dlfs" / "set" / sampler.digest).exists()


def test_an_order_name_whose_set_was_forgotten_is_not_found_until_announced_again(
    train_and_val: Path, mount
) -> None:
    """Order names keep their set by digest only, so the sets stay bounded however many names are
    looked up; a name whose set the mount forgot is not found (the sampler then announces it)."""
    with mount(train_and_val) as mnt:
        dataset = datasets.ImageFolder(str(Path(mnt) / "train"))
        sampler = ShuffleSampler(dataset, num_replicas=2, rank=1)
        first = list(sampler)
        assert sampler.order_path().exists()
        for start in range(1, KEEP_SETS + 2):
            for name in FileSet(np.arange(start, 100)).announcements():
                (Path(mnt) / ".dlfs" / "set" / name).exists()
        assert not sampler.order_path().exists()  # the name was looked up before: not kept alive
        sampler.set_epoch(1)
        assert len(list(sampler)) == len(first) and sampler.order_path().exists()  # announced again


def _run_ranks(
    spec_path: Path, roots: list[Path], seed: int | None, shares: list[int] | None = None
) -> list[dict]:
    """One real process per rank (``ddp_rank.py``), joined by gloo over loopback; their results."""
    spec = {"port": free_ports(1)[0], "world": len(roots), "roots": list(map(str, roots)), "seed": seed}
    spec_path.write_text(json.dumps({**spec, "shares": shares}))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    processes = [
        subprocess.Popen(
            [sys.executable, str(RANK_PROCESS), str(spec_path), str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(len(roots))
    ]
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
            results.append(json.loads(out.splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


def test_nodes_mounted_with_different_seeds_fail_with_one_clear_error(
    train_and_val: Path, mount, tmp_path: Path
) -> None:
    with mount(train_and_val, "--seed", "0") as node0, mount(train_and_val, "--seed", "1") as node1:
        results = _run_ranks(tmp_path / "spec.json", [Path(node0) / "train", Path(node1) / "train"], None)
    assert [set(result) for result in results] == [{"error"}, {"error"}]
    message = results[0]["error"]
    assert results[1]["error"] == message
    assert "seed is 0 on rank 0" in message and "1 on rank 1" in message and str(node1) in message
    for agreed in ("dataset id", "file set", "order mode", "world size", "drop_last"):
        assert agreed not in message


def test_two_processes_given_the_same_rank_fail_with_one_clear_error(
    train_and_val: Path, mount, tmp_path: Path
) -> None:
    with mount(train_and_val) as mnt:
        results = _run_ranks(tmp_path / "spec.json", [Path(mnt) / "val"] * 2, None, shares=[0, 0])
    assert [set(result) for result in results] == [{"error"}, {"error"}]
    assert "ranks 0, 1 all read share 0" in results[0]["error"]


def test_ranks_on_two_nodes_with_one_seed_split_the_dataset_exactly(
    train_and_val: Path, mount, tmp_path: Path
) -> None:
    """Ranks 0 and 2 on one node, rank 1 on another mounted with another --seed: ``seed=`` makes
    the order, each rank gets ceil(N / 3) samples, and together they read the dataset once."""
    with mount(train_and_val, "--seed", "0") as node0, mount(train_and_val, "--seed", "1") as node1:
        roots = [Path(node0) / "train", Path(node1) / "train", Path(node0) / "train"]
        results = _run_ranks(tmp_path / "spec.json", roots, 5)
    size = results[0]["size"]
    shares = [result["indices"] for result in results]
    assert [len(share) for share in shares] == [-(-size // 3)] * 3
    combined = [k for share in shares for k in share]
    assert set(combined) == set(range(size))
    assert len(combined) - len(set(combined)) == -(-size // 3) * 3 - size


def test_a_dataset_not_on_dlfs_is_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "plain" / "cls"
    folder.mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(folder / "x.jpg")
    with pytest.raises(NotOnDlfsError, match="not on a dlfs mount"):
        ShuffleSampler(datasets.ImageFolder(str(tmp_path / "plain")))


def test_unbuffered_pil_loader_gives_the_same_images(jpeg_dataset, mount) -> None:
    from torchvision.datasets.folder import pil_loader as stock_loader

    from dlfs.torch import pil_loader

    dataset_dir, _ = jpeg_dataset
    with mount(dataset_dir) as mnt:
        for path in sorted(Path(mnt).rglob("*.JPEG"))[:20]:
            assert pil_loader(str(path)).tobytes() == stock_loader(str(path)).tobytes()
