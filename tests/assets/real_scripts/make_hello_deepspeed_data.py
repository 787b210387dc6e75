"""Builds the offline inputs train_bert_ds.py expects: a RoBERTa-style tokenizer directory
(passed with --tokenizer) and the `datasets` cache entry for wikitext/wikitext-2-v1 (read by
load_dataset under HF_HUB_OFFLINE=1). The text is English prose from Python's own
pydoc_data.topics (the language reference), split into paragraphs like wikitext's lines.

    python make_hello_deepspeed_data.py OUT   # needs tokenizers, transformers, datasets, pyarrow
    export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_DATASETS_CACHE=OUT/hf_datasets
    # then train_bert_ds.py ... --tokenizer OUT/tokenizer (docs/real-scripts-deepspeed.md)
"""
import glob, json, os, shutil, sys, tempfile
from pydoc_data.topics import topics

out = sys.argv[1]
paras = []
for text in topics.values():
    for p in text.split("\n\n"):
        p = " ".join(p.split())
        if len(p) > 40:
            paras.append(" " + p + " \n")
        paras.append("")  # wikitext has empty lines; the script filters them
print(len([p for p in paras if p]), "paragraphs")

# tokenizer: byte-level BPE with RoBERTa's special tokens in RoBERTa's order (<pad> = 1)
from tokenizers import ByteLevelBPETokenizer
bpe = ByteLevelBPETokenizer()
bpe.train_from_iterator([p for p in paras if p], vocab_size=2000,
                        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
tokdir = os.path.join(out, "tokenizer")
os.makedirs(tokdir, exist_ok=True)
bpe.save_model(tokdir)
from transformers import PreTrainedTokenizerFast
tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", pad_token="<pad>",
                              eos_token="</s>", unk_token="<unk>", mask_token="<mask>")
tok.save_pretrained(tokdir)
print(tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.mask_token_id, tok.vocab_size)
assert tok.pad_token_id == 1 and tok.bos_token_id == 0 and tok.eos_token_id == 2, tok

# datasets cache: build through the parquet builder, then file it under wikitext's name
import datasets, pyarrow as pa, pyarrow.parquet as pq
tmp = tempfile.mkdtemp()
pq.write_table(pa.table({"text": paras}), f"{tmp}/train.parquet")
datasets.load_dataset("parquet", data_files={"train": f"{tmp}/train.parquet"}, cache_dir=f"{tmp}/c")
src = [p for p in glob.glob(f"{tmp}/c/parquet/*/*/*") if os.path.isdir(p)][0]
version, h = src.split("/")[-2:]
dst = os.path.join(out, "hf_datasets", "wikitext", "wikitext-2-v1", version, h)
shutil.rmtree(os.path.dirname(os.path.dirname(dst)), ignore_errors=True)
os.makedirs(os.path.dirname(dst))
shutil.copytree(src, dst)
for f in glob.glob(f"{dst}/parquet-*"):
    os.rename(f, f.replace("/parquet-", "/wikitext-"))
info = json.load(open(f"{dst}/dataset_info.json"))
info.update(builder_name="wikitext", config_name="wikitext-2-v1", dataset_name="wikitext")
json.dump(info, open(f"{dst}/dataset_info.json", "w"))
print("cache at", dst, os.listdir(dst))
