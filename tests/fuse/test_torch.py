"""The drop-in sampler with the real torchvision ImageFolder and a multi-worker DataLoader."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import dlfs
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from dlfs.torch import NotOnDlfsError, ShuffleSampler

CLASSES, PER_CLASS = 6, 40


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
        # A dataset that holds only some of the mount's files: the order is filtered to them.
        dataset = datasets.ImageFolder(
            str(mnt), is_valid_file=lambda p: os.path.dirname(p) == str(sub), allow_empty=True
        )
        sampler = ShuffleSampler(dataset)
        indices = list(sampler)
        assert sorted(indices) == list(range(PER_CLASS))
        expected = [line for line in _published(Path(mnt), "epoch-0") if line.startswith(sub.name + "/")]
        assert [dataset.samples[k][0] for k in indices] == [str(Path(mnt) / line) for line in expected]


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
