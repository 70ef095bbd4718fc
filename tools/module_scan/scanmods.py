"""torch.nn building blocks common models use, each wrapped to take one tensor: `scan.yaml`
captures them all in the default mode, to find torch ops or decompositions aotpipe cannot
store or that compute another function than eager (see docs/capture-modes.md, Recurrent layers ...)."""

import torch
from torch import nn
import torch.nn.functional as F

class Cell(nn.Module):
    def __init__(self, cls):
        super().__init__(); self.c = cls(8, 16)
    def forward(self, x):
        h = None
        for t in range(x.shape[0]):
            h = self.c(x[t]) if h is None else self.c(x[t], h)
        return h[0] if isinstance(h, tuple) else h

class MHA(nn.Module):
    def __init__(self):
        super().__init__(); self.a = nn.MultiheadAttention(16, 4, dropout=0.1)
    def forward(self, x):
        return self.a(x, x, x)[0]

class Interp(nn.Module):
    def __init__(self, mode):
        super().__init__(); self.mode = mode; self.c = nn.Conv2d(3, 4, 3)
    def forward(self, x):
        return F.interpolate(self.c(x), scale_factor=2, mode=self.mode)

def lstm_cell(): return Cell(nn.LSTMCell)
def gru_cell(): return Cell(nn.GRUCell)
def rnn_cell(): return Cell(nn.RNNCell)
def mha(): return MHA()
def encoder(): return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1)
def groupnorm(): return nn.Sequential(nn.Conv2d(3, 8, 3), nn.GroupNorm(2, 8), nn.SiLU())
def instancenorm(): return nn.Sequential(nn.Conv2d(3, 8, 3), nn.InstanceNorm2d(8, affine=True))
def bilinear(): return Interp("bilinear")
def bicubic(): return Interp("bicubic")
def nearest(): return Interp("nearest")
def pixelshuffle(): return nn.Sequential(nn.Conv2d(3, 16, 3), nn.PixelShuffle(2))
def convtranspose(): return nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2), nn.BatchNorm2d(4))
def embbag(): return nn.EmbeddingBag(50, 8, mode="mean")
def alphadrop(): return nn.Sequential(nn.Linear(8, 8), nn.AlphaDropout(0.2), nn.Linear(8, 4))
def dropout2d(): return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout2d(0.3))
def mlp_ln_mish(): return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Mish(), nn.Hardswish())
