"""Example model factories for ``complexity analyze FILE.py:FACTORY`` and the tests.

Each factory returns ``(module, example_inputs)`` or ``(module, example_inputs, loss_fn)``.
They are written from scratch (torchvision is not required): a ResNet-50-like CNN, a ViT,
a GPT block stack, an MLP with a custom ``torch.autograd.Function``, and the small models
the real-run check on a CPU uses (``mlp``, ``small_cnn``, ``resnet18_cifar``). ``branchy`` cannot
be traced on the meta device (it branches on tensor values).

Usage: ``complexity analyze examples/module_zoo.py:resnet50 --gpu h100-sxm``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- ResNet-50-like --------------------------------------------------------------------------
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + idt)


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), widths=(64, 128, 256, 512), classes: int = 1000,
                 stem: int = 64, groups: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(stem), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        stages, cin = [], stem
        for i, (n, w) in enumerate(zip(layers, widths)):
            blocks = []
            for j in range(n):
                blocks.append(Bottleneck(cin, w, stride=2 if (j == 0 and i > 0) else 1,
                                         groups=groups))
                cin = w * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _classification_loss(batch: int, classes: int):
    target = torch.zeros(batch, dtype=torch.long)
    return lambda logits: F.cross_entropy(logits, target.to(logits.device))


def resnet50(batch: int = 32, image: int = 224):
    """ResNet-50 (25.6 M parameters) on ``batch`` RGB images, cross-entropy loss."""
    return ResNet(), (torch.randn(batch, 3, image, image),), _classification_loss(batch, 1000)


def resnext_tiny(batch: int = 4, image: int = 64):
    """A small grouped-convolution ResNeXt (exercises ``groups > 1``)."""
    model = ResNet(layers=(1, 1), widths=(32, 64), classes=10, stem=32, groups=8)
    return model, (torch.randn(batch, 3, image, image),)


# ---- ViT ---------------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool = False, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.fc1, self.fc2 = nn.Linear(dim, mlp_ratio * dim), nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ViT(nn.Module):
    def __init__(self, image: int = 224, patch: int = 16, dim: int = 384, depth: int = 12,
                 heads: int = 6, classes: int = 1000) -> None:
        super().__init__()
        n = (image // patch) ** 2
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def vit_small(batch: int = 16, image: int = 224):
    """ViT-S/16 (22 M parameters)."""
    return ViT(image=image), (torch.randn(batch, 3, image, image),), _classification_loss(batch, 1000)


# ---- GPT block stack -------------------------------------------------------------------------
class GPT(nn.Module):
    def __init__(self, vocab: int = 8192, dim: int = 512, depth: int = 6, heads: int = 8,
                 seq: int = 256) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, causal=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight          # tied embeddings

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def gpt_small(batch: int = 8, seq: int = 256):
    """A 6-layer, 512-wide causal GPT with tied embeddings; next-token cross-entropy."""
    model = GPT(seq=seq)
    ids = torch.randint(0, 8192, (batch, seq))
    target = torch.randint(0, 8192, (batch, seq))

    def loss_fn(logits):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.to(logits.device).reshape(-1))
    return model, (ids,), loss_fn


# ---- custom autograd.Function --------------------------------------------------------------------
class LinearFn(torch.autograd.Function):
    """A hand-written linear layer: ``y = x W^T + b`` with its own backward."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x, g.sum(0)


class SquaredReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.relu(x) ** 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * torch.relu(x)


class CustomMLP(nn.Module):
    def __init__(self, dim: int = 256, hidden: int = 1024) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(hidden, dim) * 0.02)
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(SquaredReLU.apply(LinearFn.apply(x, self.w1, self.b1)))


def custom_mlp(batch: int = 64):
    """An MLP whose first layer and activation are custom autograd Functions."""
    return CustomMLP(), (torch.randn(batch, 256),)


# ---- models for the real-run check on a CPU -------------------------------------------------------
def mlp(batch: int = 64, dim: int = 1024, hidden: int = 4096, depth: int = 3):
    """A deep MLP (25 M parameters): GEMM-bound, many equal-size gradient buckets."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.LayerNorm(dim)]
    return nn.Sequential(*layers, nn.Linear(dim, 10)), (torch.randn(batch, dim),)


def small_cnn(batch: int = 16, image: int = 32):
    """A VGG-style CNN (5.7 M parameters) on 32x32 images: conv-bound, big late layers."""
    def stage(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.MaxPool2d(2)]
    net = nn.Sequential(*stage(3, 64), *stage(64, 128), *stage(128, 256), *stage(256, 512),
                        nn.Flatten(), nn.Linear(512 * (image // 16) ** 2, 512), nn.ReLU(),
                        nn.Linear(512, 10))
    return net, (torch.randn(batch, 3, image, image),), _classification_loss(batch, 10)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.short is None else self.short(x)))


def resnet18_cifar(batch: int = 8, image: int = 32):
    """ResNet-18 for 32x32 images (11.2 M parameters): residual, conv-bound."""
    layers, cin = [nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU()], 64
    for i, w in enumerate((64, 128, 256, 512)):
        layers += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w)]
        cin = w
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))
    return net, (torch.randn(batch, 3, image, image),), _classification_loss(batch, 10)


# ---- not traceable on meta --------------------------------------------------------------------
class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        if x.mean() > 0:                 # data-dependent control flow
            return self.a(x)
        return self.b(x)


def branchy():
    return Branchy(), (torch.randn(4, 16),)
