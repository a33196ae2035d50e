"""The benchmark layer table: which group-width-8 layers spio is measured on.

Every entry is one (C, H, W, R, S, padding) shape timed at several batch sizes. The regnetx_002
rows come from timm's RegNet definition (timm/models/regnet.py): `regnetx_002 = RegNetCfg(w0=24,
wa=36.44, wm=2.49, group_size=8, depth=13)`. Its width rule (generate_regnet, quantised to
multiples of 8) gives block widths [24, 56, 152x4, 368x7], i.e. four stages of depth 1, 1, 4, 7 at
24, 56, 152 and 368 channels. The stem (stride 2) takes 224x224 to 112x112 and each stage's first
block has stride 2, so the stages run at 56, 28, 14 and 7 pixels. Each block's 3x3 conv2 has
groups = width / 8 (group width 8, padding 1, no bias); only blocks 2.. of a stage have stride 1,
so the stride-1 gw8 layers are 152c 14x14 (three blocks of stage 3) and 368c 7x7 (six blocks of
stage 4). Stages 1 and 2 have a single, stride-2 block and contribute none.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.conv2d_gw8_params import Conv2dGw8Params

#: Batch sizes of the full sweep and of --quick.
BATCH_SIZES = (32, 64, 128, 256)
QUICK_BATCH_SIZES = (32, 128)


@dataclass(frozen=True)
class BenchLayer:
    """One row of the layer table: a gw8 conv shape (without batch size) and where it comes from."""

    name: str
    c: int
    h: int
    w: int
    r: int = 3
    s: int = 3
    padding: tuple[int, int] = (1, 1)
    source: str = ""

    def params(self, n: int, dtype: str = "fp16", has_bias: bool = False) -> Conv2dGw8Params:
        """The layer at batch size n in dtype ("fp16" or "bf16")."""
        return Conv2dGw8Params(
            n, self.c, self.h, self.w, self.padding, self.r, self.s, has_bias=has_bias, dtype=dtype
        )


def layer_table() -> list[BenchLayer]:
    """Every layer of the table, in a fixed order (names are unique and used in CSV files)."""
    return [
        BenchLayer("64c_64x64_3x3", 64, 64, 64, source="ConvFirst-like (the seed's figure)"),
        BenchLayer("128c_32x32_3x3", 128, 32, 32),
        BenchLayer("256c_16x16_3x3", 256, 16, 16),
        BenchLayer("512c_8x8_3x3", 512, 8, 8),
        BenchLayer("96c_56x56_5x5", 96, 56, 56, 5, 5, (2, 2)),
        BenchLayer("192c_28x28_5x5", 192, 28, 28, 5, 5, (2, 2)),
        BenchLayer("128c_32x32_1x3", 128, 32, 32, 1, 3, (0, 1)),
        BenchLayer("128c_32x32_3x1", 128, 32, 32, 3, 1, (1, 0)),
        BenchLayer("152c_14x14_3x3", 152, 14, 14, source="timm regnetx_002 stage 3, blocks 2-4"),
        BenchLayer("368c_7x7_3x3", 368, 7, 7, source="timm regnetx_002 stage 4, blocks 2-7"),
    ]


def parse_layer(text: str) -> BenchLayer:
    """A layer from a bench-table name or a shape `C,H,W[,R,S[,PAD_H,PAD_W]]` (R, S: 3 by
    default; padding: R//2, S//2, which keeps the image size for odd R and S). Named like the
    table's rows, with `_pad<PAD_H>x<PAD_W>` where the padding is not the default. A shape spio
    cannot run is a ValueError naming the constraint and the value."""
    table = {layer.name: layer for layer in layer_table()}
    if text in table:
        return table[text]
    parts = [part.strip() for part in text.split(",")]
    if len(parts) not in (3, 5, 7) or not all(part.isascii() and part.isdigit() for part in parts):
        raise ValueError(
            f"a layer is a bench-table name ({', '.join(table)}) or C,H,W[,R,S[,PAD_H,PAD_W]] "
            f"in non-negative integers, got {text!r}"
        )
    c, h, w, r, s = ([int(part) for part in parts[:5]] + [3, 3])[:5]
    padding = (int(parts[5]), int(parts[6])) if len(parts) == 7 else (r // 2, s // 2)
    Conv2dGw8Params(1, c, h, w, padding, r, s)  # the checks of every spio layer, with its errors
    name = f"{c}c_{h}x{w}_{r}x{s}"
    if padding != (r // 2, s // 2):
        name += f"_pad{padding[0]}x{padding[1]}"
    return BenchLayer(name, c, h, w, r, s, padding, source="given as a shape")


def select_layers(layers: list[BenchLayer], patterns: list[str] | None) -> list[BenchLayer]:
    """The layers whose name contains any of `patterns` (all of them when patterns is empty).
    A ValueError names every pattern that matches no layer (a typo among matching patterns too)
    and lists the layers' names."""
    if not patterns:
        return list(layers)
    unmatched = [p for p in patterns if not any(p in layer.name for layer in layers)]
    if unmatched:
        names = ", ".join(layer.name for layer in layers)
        raise ValueError(f"no benchmark layer matches {unmatched}; layers: {names}")
    return [layer for layer in layers if any(p in layer.name for p in patterns)]
