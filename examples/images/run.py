"""A torch CNN image classifier over a folder of PNG files, exported and run by chute.

The script makes a few hundred small PNG images of three classes (noise with a red, a
green or a blue square), trains a tiny CNN on them for a few seconds, exports it — the
uint8 ``(N, H, W, C)`` → float ``(N, C, H, W)`` conversion included — to TorchScript (or
ONNX), and runs ``job.yaml`` over the folder: chute decodes the images in the read stage,
the ``torch`` (or ``onnx``) adapter predicts ``label`` and ``score``, and the file path is
carried over next to them. It then checks every prediction against calling the exported
classifier directly on the images decoded by Pillow.

    python examples/images/run.py                              # local engine, TorchScript
    python examples/images/run.py --engine ray --format onnx   # Ray, ONNX Runtime
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

HERE = Path(__file__).resolve().parent
WORKDIR = HERE.parent.parent / "chute-demo" / "images"
CLASSES = ["red", "green", "blue"]
SIZE = 32


def make_images(folder: Path, count: int, seed: int = 0) -> list[int]:
    """``count`` PNGs of ``SIZE``×``SIZE`` (some larger: the job resizes); their classes."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    labels = []
    for i in range(count):
        label = int(rng.integers(len(CLASSES)))
        side = SIZE if i % 4 else 48  # a quarter of them are bigger than the model's input
        pixels = rng.integers(0, 110, (side, side, 3), dtype=np.uint8)
        top, left = rng.integers(0, side // 2, 2)
        pixels[top : top + side // 2, left : left + side // 2, label] += 120
        Image.fromarray(pixels).save(folder / f"img{i:05d}.png")
        labels.append(label)
    return labels


def decode(paths: list[str]) -> np.ndarray:
    """Images as the job reads them: RGB, resized to ``SIZE``×``SIZE`` (bilinear)."""
    return np.stack(
        [
            np.asarray(Image.open(p).convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR))
            for p in paths
        ]
    )


class Classifier(torch.nn.Module):
    """A tiny CNN that takes the images as chute hands them: uint8, ``(N, H, W, C)``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(16, len(CLASSES)),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).to(torch.float32) / 255.0
        return self.net(x)  # type: ignore[no-any-return]


def train(pixels: np.ndarray, labels: list[int], epochs: int = 15) -> Classifier:
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.from_numpy(pixels), torch.tensor(labels)
    for _ in range(epochs):
        for start in range(0, len(x), 32):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(
                model(x[start : start + 32]), y[start : start + 32]
            )
            loss.backward()
            optimizer.step()
    return model.eval()


def export(model: Classifier, example: np.ndarray, path: Path, fmt: str) -> None:
    sample = torch.from_numpy(example[:2])
    if fmt == "torchscript":
        torch.jit.save(torch.jit.trace(model, sample), str(path))
        return
    batch = torch.export.Dim("batch", min=1)
    torch.onnx.export(
        model,
        (sample,),
        str(path),
        input_names=["image"],
        output_names=["logits"],
        dynamic_shapes={"images": {0: batch}},
        dynamo=True,
        verbose=False,
    )


def direct(path: Path, fmt: str, pixels: np.ndarray) -> np.ndarray:
    """The logits of the exported classifier, called without chute."""
    if fmt == "torchscript":
        with torch.inference_mode():
            return torch.jit.load(str(path))(torch.from_numpy(pixels)).numpy()  # type: ignore[no-any-return]
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": pixels})[0]  # type: ignore[no-any-return]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--engine", choices=["local", "ray", "auto"], default="local")
    parser.add_argument("--format", choices=["torchscript", "onnx"], default="torchscript")
    parser.add_argument("--workdir", default=str(WORKDIR), help="where images and outputs go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import pandas as pd

    from chute.config import load_job

    args = parse_args(argv)
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    labels = make_images(work / "images", args.images)
    paths = sorted(str(p) for p in (work / "images").iterdir())
    pixels = decode(paths)
    model = train(pixels, labels)
    artifact = work / ("classifier.ts" if args.format == "torchscript" else "classifier.onnx")
    export(model, pixels, artifact, args.format)

    shutil.copy(HERE / "job.yaml", work / "job.yaml")  # its relative paths: into ``work``
    overrides: dict[str, Any] = {"engine": args.engine}
    job = load_job(str(work / "job.yaml"), **overrides)
    if args.format == "onnx":
        job = _with_onnx(job, artifact)
    started = time.perf_counter()
    report = job.run()
    seconds = time.perf_counter() - started

    out = pd.read_parquet(work / "predictions").sort_values("path").reset_index(drop=True)
    expected = direct(artifact, args.format, pixels)
    got = np.stack(out.classifier_logits.to_numpy())
    diff = float(np.max(np.abs(got - expected)))
    predicted = [CLASSES[i] for i in got.argmax(axis=1)]
    labels_equal = predicted == [CLASSES[i] for i in expected.argmax(axis=1)]
    if "classifier_label" in out:  # the torch adapter names the classes itself
        labels_equal = labels_equal and list(out.classifier_label) == predicted
    accuracy = float(np.mean([CLASSES[t] == p for t, p in zip(labels, predicted, strict=True)]))
    ok = list(out.path) == paths and labels_equal and diff <= 1e-5
    print(
        f"{report.rows_out:,} images on the {report.engine} engine ({args.format}) in "
        f"{seconds:.2f} s ({report.rows_out / seconds:,.0f} images/s); accuracy {accuracy:.1%}"
    )
    print(
        f"labels equal to the classifier called directly: {labels_equal}; "
        f"max |logit diff| = {diff:.1e}: {'OK' if ok else 'MISMATCH'}"
    )
    if not ok:
        raise SystemExit(1)
    return {
        "rows": report.rows_out,
        "engine": report.engine,
        "accuracy": accuracy,
        "labels_equal": labels_equal,
        "logit_diff": diff,
        "paths": list(out.path),
        "expected_paths": paths,
        "columns": list(out.columns),
    }


def _with_onnx(job: Any, artifact: Path) -> Any:
    """The same job with the ONNX export, run by the ``onnx`` adapter, in place of TorchScript:
    the graph takes the ``(N, H, W, C)`` uint8 images the read stage decodes."""
    import dataclasses

    import chute

    (model,) = job.models
    onnx = chute.Model(
        model.name,
        chute.adapter("onnx", path=str(artifact)),
        inputs=model.inputs,
        batch_size=model.batch_size,
    )
    return dataclasses.replace(job, models=(onnx,))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    main(sys.argv[1:])
