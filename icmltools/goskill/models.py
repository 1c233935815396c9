"""GO-Skill networks (official structure) and the MT-BC / MT-BC-RTG baselines."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .blocks import CausalTransformer
from .vq import VectorQuantizer


def mlp_tanh(d_in: int, hidden: int, n_layers: int, d_out: int) -> nn.Sequential:
    """[Linear -> ReLU] x n_layers -> Linear(hidden, d_out) -> Tanh (actions live in [-1, 1])."""
    dims = [d_in] + [hidden] * n_layers
    layers = []
    for i in range(n_layers):
        layers += [nn.Linear(dims[i], dims[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, d_out), nn.Tanh())


class GoalEncoder(nn.Module):
    """Linear(ds->h) -> LayerNorm -> [Linear(h->h) -> ReLU] x (n_layers-1) -> Linear(h->vq) -> Tanh."""

    def __init__(self, ds: int, hidden: int = 256, out: int = 64, n_layers: int = 3):
        super().__init__()
        layers = [nn.Linear(ds, hidden), nn.LayerNorm(hidden)]
        for _ in range(n_layers - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers += [nn.Linear(hidden, out), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class TransformerSkillDecoder(nn.Module):
    """Causal transformer over [code, (enc(s_{t+k}-s_t), s_{t+k}, a_{t+k}) for k < H] with a learned
    in-skill step embedding; a_{t+k} is read (tanh) from the s_{t+k} token (Sec. 4.1, official layout)."""

    def __init__(self, ds, da, vq, hidden, n_layers, n_heads, H, dropout=0.1):
        super().__init__()
        self.H, self.hidden = H, hidden
        self.embed_code = nn.Linear(vq, hidden)   # shared by the code token and the state-change encodings
        self.embed_state = nn.Linear(ds, hidden)
        self.embed_action = nn.Linear(da, hidden)
        self.embed_step = nn.Embedding(H, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.tf = CausalTransformer(hidden, n_layers, n_heads, dropout)
        self.head = nn.Sequential(nn.Linear(hidden, da), nn.Tanh())

    def forward(self, code_vec, enc, states, actions):
        B, H = states.shape[:2]
        step = self.embed_step(torch.arange(H, device=states.device))[None]
        e = self.embed_code(enc) + step
        s = self.embed_state(states) + step
        a = self.embed_action(actions) + step
        tok = torch.stack([e, s, a], dim=2).reshape(B, 3 * H, self.hidden)
        tok = torch.cat([self.embed_code(code_vec)[:, None], tok], dim=1)
        x = self.tf(self.ln(tok))[:, 1:].reshape(B, H, 3, self.hidden)[:, :, 1]
        return self.head(x)


class MLPSkillDecoder(nn.Module):
    """The small CPU alternative: a_{t+k} = MLP([code, enc(s_{t+k}-s_t), s_{t+k}, onehot(k)])."""

    def __init__(self, ds, da, vq, hidden, H, n_layers=3):
        super().__init__()
        self.H = H
        self.net = mlp_tanh(vq + vq + ds + H, hidden, n_layers, da)

    def forward(self, code_vec, enc, states, actions):
        B, H = states.shape[:2]
        k = torch.eye(self.H, device=states.device)[:H][None].expand(B, -1, -1)
        x = torch.cat([code_vec[:, None].expand(-1, H, -1), enc, states, k], dim=-1)
        return self.net(x)


class SkillModel(nn.Module):
    """Goal encoder + VQ codebook + skill decoder (the low-level policy)."""

    def __init__(self, ds, da, cfg):
        super().__init__()
        self.H = cfg.H
        self.encoder = GoalEncoder(ds, cfg.enc_hidden, cfg.vq_dim, cfg.enc_layers)
        self.vq = VectorQuantizer(cfg.n_codes, cfg.vq_dim, cfg.vq_decay, cfg.commitment, cfg.kmeans_init)
        if cfg.decoder == "transformer":
            self.decoder = TransformerSkillDecoder(ds, da, cfg.vq_dim, cfg.dec_hidden, cfg.dec_layers, cfg.dec_heads,
                                                   cfg.H, cfg.dropout)
        else:
            self.decoder = MLPSkillDecoder(ds, da, cfg.vq_dim, cfg.dec_hidden, cfg.H)

    def state_changes(self, states):
        """enc(s_{t+k} - s_t) for every k of the window (states (B,H,ds))."""
        return self.encoder(states - states[:, :1])

    def forward(self, states, goal, actions, freeze: bool = False):
        """Phase 1 (freeze=False): quantise enc(g), decode the window's actions. Returns (pred, codes, vq_loss)."""
        z = self.encoder(goal)
        q, codes, vq_loss = self.vq(z, freeze=freeze)
        enc = self.state_changes(states)
        if freeze:
            q, enc = q.detach(), enc.detach()
        return self.decoder(q, enc, states, actions), codes, vq_loss

    @torch.no_grad()
    def codes_of(self, goal):
        return self.vq.nearest(self.encoder(goal))

    def act(self, code_idx, states, actions, k: int):
        """Action at in-skill step k from the history s_t..s_{t+k}, a_t..a_{t+k-1} (zero-padded to H)."""
        B, H = states.shape[0], self.H
        pad_s = states.new_zeros(B, H - states.shape[1], states.shape[2])
        S = torch.cat([states, pad_s], 1)
        A = torch.cat([actions, actions.new_zeros(B, H - actions.shape[1], actions.shape[2])], 1)
        enc = self.state_changes(S)
        return self.decoder(self.vq.lookup(code_idx), enc, S, A)[:, k]


class HighLevelPolicy(nn.Module):
    """Prompt-DT over skill steps: tokens (R_i, s_i, z_i) + timestep embeddings, a trajectory prompt of the
    same task (or a task-id embedding) in front; logits over the codes read from the s_i token (Sec. 4.3)."""

    def __init__(self, ds, vq, n_codes, cfg, n_tasks: int, max_ep_len: int):
        super().__init__()
        h = cfg.hl_hidden
        self.hidden, self.conditioning = h, cfg.conditioning
        self.embed_t, self.embed_R = nn.Embedding(max_ep_len, h), nn.Linear(1, h)
        self.embed_s, self.embed_z = nn.Linear(ds, h), nn.Linear(vq, h)
        if cfg.conditioning == "prompt":
            self.p_embed_t, self.p_embed_R = nn.Embedding(max_ep_len, h), nn.Linear(1, h)
            self.p_embed_s, self.p_embed_z = nn.Linear(ds, h), nn.Linear(vq, h)
        else:
            self.embed_task = nn.Embedding(n_tasks, h)
        self.ln = nn.LayerNorm(h)
        self.tf = CausalTransformer(h, cfg.hl_layers, cfg.hl_heads, cfg.dropout)
        self.head = nn.Linear(h, n_codes)

    def _tokens(self, s, z, r, ts, es, ez, er, et):
        B, L = s.shape[:2]
        t = et(ts)
        return torch.stack([er(r) + t, es(s) + t, ez(z) + t], 2).reshape(B, 3 * L, self.hidden)

    def forward(self, s, z, r, ts, mask, prompt=None, task=None):
        B, L = s.shape[:2]
        tok = self._tokens(s, z, r, ts, self.embed_s, self.embed_z, self.embed_R, self.embed_t)
        m = mask.repeat_interleave(3, dim=1)
        if self.conditioning == "prompt":
            ps, pz, pr, pts, pm = prompt
            ptok = self._tokens(ps, pz, pr, pts, self.p_embed_s, self.p_embed_z, self.p_embed_R, self.p_embed_t)
            tok = torch.cat([ptok, tok], 1)
            m = torch.cat([pm.repeat_interleave(3, dim=1), m], 1)
        else:
            tok = tok + self.embed_task(task)[:, None]
        x = self.tf(self.ln(tok), key_mask=m > 0)[:, -3 * L:].reshape(B, L, 3, self.hidden)[:, :, 1]
        return self.head(x)


class BCPolicy(nn.Module):
    """MT-BC (inputs: state, task one-hot) or MT-BC-RTG (also the scaled return-to-go): MLP -> tanh."""

    def __init__(self, ds, da, n_tasks, hidden=256, n_layers=3, rtg: bool = False):
        super().__init__()
        self.n_tasks, self.rtg = n_tasks, rtg
        self.net = mlp_tanh(ds + n_tasks + (1 if rtg else 0), hidden, n_layers, da)

    def forward(self, s, task, rtg=None):
        x = [s, F.one_hot(task, self.n_tasks).to(s.dtype)]
        if self.rtg:
            x.append(rtg.reshape(-1, 1))
        return self.net(torch.cat(x, -1))
