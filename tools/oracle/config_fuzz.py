"""Random Qwen3.5 configurations: checkpoints written by transformers, logits compared with `onepass logits`.

    cargo build --release -p onepass
    python tools/oracle/config_fuzz.py --seeds 1-40 [--onepass target/release/onepass] [--keep DIR]

Each seed draws a small text model (`Qwen3_5ForCausalLM`) or a composite one (`Qwen3_5ForConditionalGeneration`,
vision tower included) with its own shape: hidden size, attention heads and KV heads, head dim, partial rotary factor
(mrope sections or none, interleaved or not), rope theta, Gated DeltaNet key/value heads and dims, conv kernel, layer
pattern (`layer_types`, or `full_attention_interval`), tied or untied embeddings, RMS epsilon; random weights scaled
so that every block moves the logits (transformers' default init hides bugs); saved by `save_pretrained` in float32,
bfloat16 or float16, sometimes sharded (an index file). transformers computes float32 logits for three token
sequences (1 token, a short one, one past a 64-token chunk) from the saved weights; the script runs `onepass logits
--device cpu` on the same folder and prints per seed the largest |difference| relative to the logits' spread. These
are checkpoints onepass's synthetic presets never made: a check of the loader and the model against transformers on
shapes nobody chose. Not a CI test (it needs torch).
"""
import argparse, json, math, os, random, shutil, subprocess, sys, tempfile, warnings

warnings.filterwarnings("ignore")

import torch
import transformers


def draw(seed):
    r = random.Random(seed)
    heads = r.choice([1, 2, 4, 8])
    kv = r.choice([d for d in (1, 2, 4, 8) if heads % d == 0])
    head_dim = r.choice([8, 16, 32, 64])
    partial = r.choice([0.25, 0.5, 1.0])
    rot = int(head_dim * partial) & ~1
    lk_heads = r.choice([1, 2, 4])
    lv_heads = lk_heads * r.choice([1, 2, 3])
    layers = r.randint(2, 6)
    if r.random() < 0.3:
        interval = r.randint(1, min(4, layers))
        types = None
    else:
        interval = None
        types = [r.choice(["linear_attention", "full_attention"]) for _ in range(layers)]
        if "full_attention" not in types:  # transformers' cache needs one (every Qwen3.5 has several)
            types[r.randrange(layers)] = "full_attention"
    rope = {"rope_type": "default", "rope_theta": r.choice([10000.0, 1e6, 1e7]), "partial_rotary_factor": partial}
    if r.random() < 0.6 and rot >= 6:
        h = rot // 2
        a = r.randint(1, h - 2)
        b = r.randint(1, h - a - 1)
        rope["mrope_section"] = [a, b, h - a - b]
        rope["mrope_interleaved"] = r.random() < 0.7
    text = dict(vocab_size=r.choice([300, 512, 1000, 2048]), hidden_size=r.choice([32, 48, 64, 96, 128]),
                intermediate_size=r.choice([40, 64, 100, 256]), num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                max_position_embeddings=4096, rms_norm_eps=r.choice([1e-6, 1e-5]),
                tie_word_embeddings=r.random() < 0.5, linear_conv_kernel_dim=r.choice([2, 3, 4]),
                linear_key_head_dim=r.choice([8, 16, 32]), linear_value_head_dim=r.choice([8, 16, 24, 32]),
                linear_num_key_heads=lk_heads, linear_num_value_heads=lv_heads, rope_parameters=rope)
    if types is not None:
        text["layer_types"] = types
    composite = r.random() < 0.3
    dtype = r.choice(["float32", "bfloat16", "float16"])
    shard = r.random() < 0.3
    return text, interval, composite, dtype, shard, r


def build(text, interval, composite, r):
    cfg_t = transformers.Qwen3_5TextConfig(**text)
    if interval is not None:
        cfg_t.layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                             for i in range(text["num_hidden_layers"])]
        cfg_t.full_attention_interval = interval
    if composite:
        vis = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                   patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64)
        cfg = transformers.Qwen3_5Config(text_config=cfg_t.to_dict(), vision_config=vis,
                                         tie_word_embeddings=text["tie_word_embeddings"],
                                         image_token_id=text["vocab_size"] - 4, video_token_id=text["vocab_size"] - 3,
                                         vision_start_token_id=text["vocab_size"] - 2,
                                         vision_end_token_id=text["vocab_size"] - 1)
        model = transformers.Qwen3_5ForConditionalGeneration(cfg)
    else:
        model = transformers.Qwen3_5ForCausalLM(cfg_t)
    g = torch.Generator().manual_seed(r.randint(0, 2 ** 31))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[1] if p.dim() == 2 else p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * (1.2 / math.sqrt(fan_in)))
            elif name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.0 - 1.0)
            else:  # norms, dt_bias, biases: around their defaults, far enough to matter
                p.copy_(p + torch.randn(p.shape, generator=g) * 0.3)
    model.eval()
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="1-20", help="A-B or a comma list")
    ap.add_argument("--onepass", default="target/release/onepass")
    ap.add_argument("--keep", help="keep each checkpoint in DIR/seed-N")
    a = ap.parse_args()
    seeds = (list(range(int(a.seeds.split("-")[0]), int(a.seeds.split("-")[1]) + 1)) if "-" in a.seeds
             else [int(x) for x in a.seeds.split(",")])
    worst = 0.0
    for seed in seeds:
        text, interval, composite, dtype, shard, r = draw(seed)
        d = os.path.join(a.keep, f"seed-{seed}") if a.keep else tempfile.mkdtemp(prefix="cfgfuzz-")
        try:
            model = build(text, interval, composite, r)
            model.to(getattr(torch, dtype)).save_pretrained(d, max_shard_size="200KB" if shard else "10GB")
            ref = (transformers.Qwen3_5ForConditionalGeneration if composite else transformers.Qwen3_5ForCausalLM) \
                .from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
            V = text["vocab_size"]
            line = []
            for n in (1, r.randint(2, 40), r.randint(65, 150)):
                ids = [r.randrange(V) for _ in range(n)]
                with torch.no_grad():
                    want = ref(input_ids=torch.tensor([ids])).logits[0].float()
                out = subprocess.run([a.onepass, "logits", "--device", "cpu", "--model", d, "--ids",
                                      ",".join(map(str, ids))], capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"seed {seed}: onepass failed: {out.stderr.strip()[:400]}")
                    line = None
                    break
                got = torch.tensor(json.loads(out.stdout)["logits"])
                spread = want.std().item()
                rel = (got - want).abs().max().item() / max(spread, 1e-6)
                line.append(f"{n}:{rel:.1e}")
                worst = max(worst, rel)
            if line is not None:
                shape = (f"{'composite' if composite else 'text'} {dtype}{' sharded' if shard else ''} L{text['num_hidden_layers']}"
                         f" h{text['hidden_size']} H{text['num_attention_heads']}/{text['num_key_value_heads']}x{text['head_dim']}"
                         f" rope {text['rope_parameters'].get('partial_rotary_factor')}"
                         f"{' m' + str(text['rope_parameters']['mrope_section']) if 'mrope_section' in text['rope_parameters'] else ''}"
                         f" lin {text['linear_num_key_heads']}/{text['linear_num_value_heads']}x{text['linear_key_head_dim']}/{text['linear_value_head_dim']}"
                         f" conv{text['linear_conv_kernel_dim']} {'tied' if text['tie_word_embeddings'] else 'untied'}"
                         f" {'interval ' + str(interval) if interval else 'types ' + ''.join('A' if t == 'full_attention' else 'L' for t in text['layer_types'])}")
                print(f"seed {seed}: {shape}: max |diff| / std(logits) {' '.join(line)}", flush=True)
        except Exception as e:  # transformers refusing a drawn configuration: say so, go on
            print(f"seed {seed}: transformers failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        finally:
            if not a.keep:
                shutil.rmtree(d, ignore_errors=True)
    print(f"worst {worst:.2e}")


if __name__ == "__main__":
    main()
