"""Held-out models of other families (drawn 2026-11-24 to measure aotpipe on models it had not met):
plain torch (scans, routing, RNN loops, FFT, graph message passing, in-place views...), diffusers
and x-transformers. The diffusers and x-transformers ones need: pip install diffusers x-transformers
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SelectiveScan(nn.Module):  # Mamba-like: a Python loop over time
    def __init__(self, d=16, n=8):
        super().__init__()
        self.inp = nn.Linear(d, 2 * d)
        self.dt = nn.Linear(d, d)
        self.A = nn.Parameter(-torch.rand(d, n))
        self.B = nn.Linear(d, n)
        self.C = nn.Linear(d, n)
        self.out = nn.Linear(d, d)

    def forward(self, x):  # [b, t, d]
        u, gate = self.inp(x).chunk(2, -1)
        dt = F.softplus(self.dt(u))
        B, C = self.B(u), self.C(u)
        h = x.new_zeros(x.shape[0], x.shape[2], self.A.shape[1])
        ys = []
        for t in range(x.shape[1]):
            h = torch.exp(dt[:, t, :, None] * self.A) * h + dt[:, t, :, None] * B[:, t, None, :] * u[:, t, :, None]
            ys.append((h * C[:, t, None, :]).sum(-1))
        return self.out(torch.stack(ys, 1) * F.silu(gate))


class CondBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.a(x).relu(), lambda x: self.b(x).tanh(), (x,))


class TopKMoE(nn.Module):
    def __init__(self, d=16, e=4, k=2):
        super().__init__()
        self.router = nn.Linear(d, e)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d)) for _ in range(e))
        self.k = k

    def forward(self, x):  # [b, t, d]
        flat = x.reshape(-1, x.shape[-1])
        w, idx = torch.topk(self.router(flat).softmax(-1), self.k, -1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            hit = (idx == e).to(flat.dtype)  # dense dispatch: every token, weighted 0 where not routed
            weight = (w * hit).sum(-1, keepdim=True)
            out = out + weight * expert(flat)
        return out.reshape(x.shape)


class Seq2SeqGRU(nn.Module):
    def __init__(self, v=50, d=16):
        super().__init__()
        self.emb = nn.Embedding(v, d)
        self.enc = nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(2 * d, d)
        self.dec = nn.GRUCell(d, d)
        self.head = nn.Linear(d, v)

    def forward(self, src, tgt):
        enc, h = self.enc(self.emb(src))
        s = torch.tanh(self.bridge(torch.cat([h[0], h[1]], -1)))
        outs = []
        for t in range(tgt.shape[1]):
            s = self.dec(self.emb(tgt[:, t]), s)
            att = torch.softmax(torch.einsum("bd,btd->bt", s, enc[..., :s.shape[-1]]), -1)
            outs.append(self.head(s + torch.einsum("bt,btd->bd", att, enc[..., :s.shape[-1]])))
        return torch.stack(outs, 1)


class LSTMProj(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(12, 24, num_layers=2, proj_size=8, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


class GridSampleWarp(nn.Module):
    def __init__(self):
        super().__init__()
        self.flow = nn.Conv2d(3, 2, 3, padding=1)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, img):
        b, _, h, w = img.shape
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        grid = torch.stack([xs, ys], -1).expand(b, h, w, 2) + 0.1 * torch.tanh(self.flow(img)).permute(0, 2, 3, 1)
        return self.conv(F.grid_sample(img, grid, align_corners=False))


class FFTFilter2d(nn.Module):
    def __init__(self, c=4, h=16, w=16):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c, h, w // 2 + 1, 2) * 0.02)

    def forward(self, x):
        f = torch.fft.rfft2(x, norm="ortho")
        f = f * torch.view_as_complex(self.weight)
        return torch.fft.irfft2(f, s=x.shape[-2:], norm="ortho")


class BagWeighted(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 16, mode="sum")
        self.head = nn.Linear(16, 4)

    def forward(self, ids, weights):
        return self.head(self.bag(ids, per_sample_weights=weights))


class NativeDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.1, batch_first=True, norm_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)

    def forward(self, tgt, memory):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.dec(tgt, memory, tgt_mask=mask, tgt_is_causal=True)


class InPlaceViews(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        y[:, :2] += 1.0
        y[:, 2:4].mul_(0.5)
        return y.relu_()


class NonzeroGather(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        keep = y[:, 0] > 0
        return y[keep].sum(0) + y.mean(0)


class WeightNormConv1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 8, 5, padding=2))
        self.conv2 = nn.Conv1d(8, 4, 3, padding=2, dilation=2)

    def forward(self, x):
        return self.conv2(F.leaky_relu(self.conv(x), 0.1))


class SDPAMaskDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        keep = mask > 0.3
        keep[:, 0] = True
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :],
                                              dropout_p=0.1 if self.training else 0.0)


class ScatterMaxGNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.msg = nn.Linear(16, 16)
        self.upd = nn.Linear(32, 16)

    def forward(self, x, edge_index):
        src, dst = edge_index[0], edge_index[1]
        m = F.relu(self.msg(x[src]))
        agg = torch.full_like(x, -1e4).scatter_reduce(0, dst[:, None].expand_as(m), m, reduce="amax", include_self=True)
        return self.upd(torch.cat([x, agg], -1))


class MHAPadded(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, dropout=0.1)

    def forward(self, x, pad):  # x [t, b, d]; pad [b, t] in [0, 1): the last 30% of values pad
        mask = pad > 0.7
        mask[:, 0] = False  # every row attends somewhere
        return self.mha(x, x, x, key_padding_mask=mask, need_weights=False)[0]


class ShuffleTranspose3d(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose3d(4, 4, 2, stride=2)
        self.conv = nn.Conv2d(4, 16, 3, padding=1)

    def forward(self, v, img):
        y = self.up(v).mean(2)
        return F.pixel_unshuffle(F.pixel_shuffle(self.conv(img), 2), 2) + y.mean()


class BN1dPermuted(nn.Module):  # PatchTST's pattern: batch norm over channels of a permuted [b, t, c]
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x):  # [b, t, 8]
        y = self.bn(self.lin(x).transpose(1, 2)).transpose(1, 2)
        return y.reshape(y.shape[0], -1)


class SpectralNormMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.utils.parametrizations.spectral_norm(nn.Linear(8, 16))
        self.b = nn.Linear(16, 2)

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


def make(name):
    return globals()[name]()


def diffusers_unet():
    import diffusers
    return diffusers.UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                                 block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8)


class _UNetCond(nn.Module):
    def __init__(self):
        super().__init__()
        import diffusers
        self.unet = diffusers.UNet2DConditionModel(
            sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8)

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states).sample


def diffusers_unet_cond():
    return _UNetCond()


class _VAE(nn.Module):
    def __init__(self):
        super().__init__()
        import diffusers
        self.vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(16, 32),
                                           down_block_types=("DownEncoderBlock2D",) * 2,
                                           up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=8)

    def forward(self, x):
        return self.vae(x, sample_posterior=False).sample


def diffusers_vae():
    return _VAE()


class _DiT(nn.Module):
    def __init__(self):
        super().__init__()
        import diffusers
        self.dit = diffusers.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                                   num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10)

    def forward(self, x, t, labels):
        return self.dit(x, timestep=t, class_labels=labels).sample


def diffusers_dit():
    return _DiT()


def xt_decoder():
    from x_transformers import TransformerWrapper, Decoder
    return TransformerWrapper(num_tokens=100, max_seq_len=32, attn_layers=Decoder(dim=32, depth=2, heads=4,
                                                                                  rotary_pos_emb=True, ff_glu=True))


def xt_encoder_alibi():
    from x_transformers import TransformerWrapper, Encoder
    return TransformerWrapper(num_tokens=100, max_seq_len=32, attn_layers=Encoder(dim=32, depth=2, heads=4,
                                                                                  alibi_pos_bias=True, use_rmsnorm=True))


def xt_vit():
    from x_transformers import ViTransformerWrapper, Encoder
    return ViTransformerWrapper(image_size=16, patch_size=4, num_classes=5, attn_layers=Encoder(dim=32, depth=2, heads=4))
