"""Usage: DS_ACCELERATOR=cpu python offload_ab_hello_deepspeed.py DIR_OF_train_bert_ds.py [REPEATS]

A/B on the CPU accelerator: ZeRO-1 bf16 with and without offload_optimizer=cpu, the
HelloDeepSpeed model at the sizes the doctor ran (2 layers, h 64, ff 128, vocab 50265),
batches of 8 x 128 random tokens. Times engine.step (the optimizer phase) and the whole step."""
import os, sys, time, statistics, torch, deepspeed
os.environ.setdefault("RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1"); os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
sys.path.insert(0, sys.argv[1])
import train_bert_ds as t
torch.manual_seed(0)
def engine(offload):
    cfg = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
           "bf16": {"enabled": True}, "zero_optimization": {"stage": 1, **({"offload_optimizer": {"device": "cpu"}} if offload else {})}}
    m = t.create_model(num_layers=2, num_heads=2, ff_dim=128, h_dim=64, dropout=0.1)
    e, *_ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
    return e
engines = {"offload": engine(True), "no_offload": engine(False)}
for k, e in engines.items(): print(k, type(e.basic_optimizer).__name__)
x = torch.randint(5, 2000, (8, 128)); batch = {"src_tokens": x, "tgt_tokens": x, "attention_mask": torch.ones_like(x)}
res = {k: ([], [], []) for k in engines}
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
    for k, e in engines.items():
        t0 = time.perf_counter(); loss = e(**batch); tf = time.perf_counter(); e.backward(loss); t1 = time.perf_counter(); e.step(); t2 = time.perf_counter()
        if r >= 3: res[k][0].append(t2 - t1); res[k][1].append(t2 - t0); res[k][2].append(t1 - tf)
for k, (opt, step, bwd) in res.items():
    print(f"{k}: engine.step median {statistics.median(opt)*1e3:.1f} ms, engine.backward median {statistics.median(bwd)*1e3:.1f} ms, whole step median {statistics.median(step)*1e3:.1f} ms (n={len(opt)})")
