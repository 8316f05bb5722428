"""The EAGLE-1 draft head shared by the kit trainers (scripts/train_demo_kit.py,
scripts/train_assistant_kit.py): the head's computation, as vllm/model_executor/models/llama_eagle.py
runs it, its initialisation from the target, the unrolled K-step training pass that mirrors vLLM's
draft KV cache, and the learning-rate schedule."""

from __future__ import annotations

import math


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def make_draft(target, *, zero_residual_writers: bool = False):
    """An EAGLE-1 head initialised from the target's last decoder layer (fc passes the feature through).

    zero_residual_writers: start o_proj and down_proj at zero, so the head begins as "next feature =
    this feature". Needed for models whose last layer writes very large values into the residual
    stream (SmolLM2: the final norm rescales them; fed the post-norm feature, the copied layer outputs
    ~1e5 and the first losses are ~1e5)."""
    import torch
    from torch import nn

    class EagleDraft(nn.Module):
        def __init__(self, tcfg):
            super().__init__()
            H, I = tcfg.hidden_size, tcfg.intermediate_size
            self.nh, self.nkv = tcfg.num_attention_heads, tcfg.num_key_value_heads
            self.hd = getattr(tcfg, "head_dim", None) or H // self.nh
            self.eps = tcfg.rms_norm_eps
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
            self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
            self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
            self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
            self.post_attention_layernorm = nn.Parameter(torch.ones(H))
            self.gate_proj = nn.Linear(H, I, bias=False)
            self.up_proj = nn.Linear(H, I, bias=False)
            self.down_proj = nn.Linear(I, H, bias=False)

        def state_for_vllm(self) -> dict:
            p = "layers.0."
            sd = {"fc.weight": self.fc.weight}
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                sd[f"{p}self_attn.{n}.weight"] = getattr(self, n).weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                sd[f"{p}mlp.{n}.weight"] = getattr(self, n).weight
            sd[f"{p}post_attention_layernorm.weight"] = self.post_attention_layernorm
            return {k: v.detach().clone().contiguous() for k, v in sd.items()}

        def inputs(self, emb, feat, cos, sin):
            """fc + q/k/v for one unrolled step. emb/feat [B,T,H] -> x, q [B,nh,T,d], k, v [B,nkv,T,d]."""
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            B, T, _ = emb.shape
            x = self.fc(torch.cat([emb, feat], dim=-1))  # input_layernorm is Identity in layer 0
            q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            rep = self.nh // self.nkv
            return x, q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

        def finish(self, x, attn):
            B, _, T, _ = attn.shape
            h = self.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
            r = h + x
            n = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.eps) * self.post_attention_layernorm
            return self.down_proj(nn.functional.silu(self.gate_proj(n)) * self.up_proj(n)) + r

    d = EagleDraft(target.config)
    # start from the target's last decoder layer; fc passes the feature through
    last = target.model.layers[-1]
    with torch.no_grad():
        H = target.config.hidden_size
        d.fc.weight.zero_()
        d.fc.weight[:, H:] = torch.eye(H)
        d.fc.weight.add_(torch.randn_like(d.fc.weight) * 0.01)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(d, n).weight.copy_(getattr(last.self_attn, n).weight)
        for n in ("gate_proj", "up_proj", "down_proj"):
            getattr(d, n).weight.copy_(getattr(last.mlp, n).weight)
        d.post_attention_layernorm.copy_(last.post_attention_layernorm.weight)
        if zero_residual_writers:
            d.o_proj.weight.zero_()
            d.down_proj.weight.zero_()
    return d


def unrolled_attention(q, keys: list, vals: list, scale: float):
    """Attention of draft step k = len(keys) over every position at once, as vLLM's draft KV cache
    holds it: step-1 keys at positions <= p-(k-1), plus the step-j key at position p-(k-j) for
    j = 2..k. q [B,nh,T,d]; keys/vals: one [B,nkv,T,d] per step so far (heads already repeated to
    q's). Returns [B,nh,T,d]."""
    import torch

    T = q.shape[2]
    k = len(keys)
    ar = torch.arange(T)
    s1 = torch.matmul(q, keys[0].transpose(-1, -2)) * scale  # [B,nh,T,T]
    allowed = ar.view(1, -1) <= (ar.view(-1, 1) - (k - 1))
    parts_s, parts_v = [s1.masked_fill(~allowed, float("-inf"))], []
    for j in range(2, k + 1):
        off = k - j
        kj, vj = keys[j - 1], vals[j - 1]
        if off:
            kj = torch.nn.functional.pad(kj, (0, 0, off, 0))[:, :, :T]
            vj = torch.nn.functional.pad(vj, (0, 0, off, 0))[:, :, :T]
        sj = (q * kj).sum(-1, keepdim=True) * scale  # [B,nh,T,1]
        if off:
            sj = sj.masked_fill((ar < off).view(1, 1, T, 1), float("-inf"))
        parts_s.append(sj)
        parts_v.append(vj)
    p = torch.softmax(torch.cat(parts_s, dim=-1), dim=-1).nan_to_num(0.0)
    attn = torch.matmul(p[..., :T], vals[0])
    for idx, vj in enumerate(parts_v):
        attn = attn + p[..., T + idx : T + idx + 1] * vj
    return attn


def draft_unroll(draft, target, tokens, feats, K: int):
    """Run K speculative steps over every anchor position at once, mirroring vLLM.

    tokens [B,T+1], feats [B,T,H] (target post-norm hidden states; feats[:, p] predicts tokens[:, p+1]).
    Draft position p takes (embed(tokens[p+1]), feature) and predicts feats[p+1]. Step 1 uses the
    true feature feats[p]; step k>1 at position p uses step k-1's output at p-1 and attends to the
    step-1 keys at positions <= p-(k-1) plus step-j keys at position p-(k-j) (j = 2..k): exactly the
    draft KV cache contents during vLLM's k-th draft step. Returns [out_1..out_K], each [B,T-1,H].
    """
    import torch

    B, T1 = tokens.shape
    T = T1 - 2  # draft positions 0..T-1 (need tokens[p+1] and target feats[p+1])
    emb = target.model.embed_tokens(tokens[:, 1 : T + 1])
    pos = torch.arange(T).unsqueeze(0)
    cos, sin = target.model.rotary_emb(emb, pos)
    scale = 1.0 / math.sqrt(draft.hd)
    outs, keys, vals = [], [], []
    feat = feats[:, :T]
    for k in range(1, K + 1):
        x, q, kk, vv = draft.inputs(emb, feat, cos, sin)
        keys.append(kk)
        vals.append(vv)
        attn = unrolled_attention(q, keys, vals, scale)
        out = draft.finish(x, attn)
        outs.append(out)
        feat = torch.nn.functional.pad(out, (0, 0, 1, 0))[:, :T]  # step k+1 at p uses out_k[p-1]
    return outs


def simulated_acceptance(draft, target, seqs, prompt_lens, K: int) -> dict:
    """Greedy EAGLE chain simulation on target-greedy sequences: at every anchor in the generated
    part, the accepted length is the number of leading draft steps whose argmax equals the
    target's next greedy token. Returns vLLM-style acceptance rate = accepted / drafted."""
    import torch

    acc_len, per_pos = [], [0] * K
    with torch.no_grad():
        for s, pl in zip(seqs, prompt_lens):
            x = torch.tensor([s])
            feats = target.model(input_ids=x).last_hidden_state
            outs = draft_unroll(draft, target, x, feats, K)
            T = x.shape[1] - 2
            toks = [target.lm_head(o).argmax(-1)[0] for o in outs]  # toks[k-1][p] predicts x[p+2]
            for n in range(max(pl - 1, 0), T - K + 1):
                a = 0
                for k in range(1, K + 1):
                    if int(toks[k - 1][n + k - 1]) == int(x[0, n + k + 1]):
                        a += 1
                    else:
                        break
                acc_len.append(a)
                for k in range(a):
                    per_pos[k] += 1
    n = max(1, len(acc_len))
    return {
        "anchors": len(acc_len),
        "acceptance_rate": round(sum(acc_len) / (n * K), 4),
        "mean_acceptance_length": round(1 + sum(acc_len) / n, 4),
        "per_position": [round(c / n, 4) for c in per_pos],
    }
