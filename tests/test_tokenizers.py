"""Tokenizers: SentencePiece trained in-process, and a tiny local Hugging Face tokenizer."""

import json
import os
import random

import gin
import numpy as np
import pytest
import sentencepiece as spm
import transformers
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from evotrainer import tokenizers as tk

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def math_corpus(seed: int = 0, n: int = 200) -> list[str]:
  rng = random.Random(seed)
  texts = []
  for _ in range(n):
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    texts.append(f"What is {a} + {b}? Answer: {a + b}")
    texts.append(f"User: Compute {a} * {b}.\nAssistant: The product is {a * b}.")
  return texts


@pytest.fixture
def counted_training(monkeypatch):
  """Counts calls into the SentencePiece trainer."""
  calls = []
  real = spm.SentencePieceTrainer.train

  def train(*args, **kwargs):
    calls.append(kwargs.get("vocab_size"))
    return real(*args, **kwargs)

  monkeypatch.setattr(spm.SentencePieceTrainer, "train", train)
  return calls


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
  return tk.SentencePieceTokenizer.train(math_corpus(), vocab_size=400,
                                         cache_dir=str(tmp_path_factory.mktemp("spm")))


@pytest.mark.parametrize("text", [
    "What is 12 + 7? Answer: 19",
    "User: What is 3 - 5?\nAssistant: -2",
    "  leading, double  spaces and trailing ",
    "\tunseen: é, 漢字, emoji 🙂, <tags>",
    " 19",
    "",
])
def test_sentencepiece_round_trip_is_exact(sp_tok, text):
  ids = sp_tok.encode(text)
  assert all(0 <= i < sp_tok.vocab_size for i in ids)
  assert sp_tok.decode(ids) == text


def test_sentencepiece_learns_pieces_and_splits_digits(sp_tok):
  assert isinstance(sp_tok, tk.Tokenizer)
  assert sp_tok.vocab_size <= 400
  pieces = [sp_tok._sp.id_to_piece(i) for i in range(sp_tok.vocab_size)
            if not sp_tok._sp.is_byte(i)]  # byte pieces read "<0x31>"
  # Learned words, not only characters and bytes (4 specials + 256 bytes + chars < 300).
  assert "▁Answer" in pieces or "Answer" in pieces
  assert all(sum(c.isdigit() for c in p) <= 1 for p in pieces), "a piece joins digits"
  digits = [sp_tok.decode([i]) for i in sp_tok.encode("12345")]
  assert digits == ["1", "2", "3", "4", "5"]
  # Concatenation at a word boundary tokenizes like the whole (no dummy prefix).
  prompt = sp_tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}])
  assert sp_tok.encode(prompt) + sp_tok.encode(" 4") == sp_tok.encode(prompt + " 4")


def test_sentencepiece_special_ids(sp_tok):
  specials = (sp_tok.pad_id, sp_tok.bos_id, sp_tok.eos_id)
  assert specials == (0, 2, 3)
  assert len(set(specials)) == 3
  assert all(0 <= i < sp_tok.vocab_size for i in specials)
  assert sp_tok.stop_ids == (sp_tok.eos_id,)
  text = "What is 1 + 1?"
  ids = sp_tok.encode(text, add_bos=True)
  assert ids[0] == sp_tok.bos_id and ids[1:] == sp_tok.encode(text)
  assert sp_tok.encode(sp_tok.decode(ids), add_bos=True) == ids
  # Pad is dropped and decoding does not stop at eos.
  padded = [sp_tok.pad_id] * 3 + ids + [sp_tok.eos_id] + sp_tok.encode(" more")
  assert sp_tok.decode(padded) == text + " more"
  assert sp_tok.decode(np.asarray(ids, np.int32)) == text
  with pytest.raises(ValueError, match="outside the vocabulary"):
    sp_tok.decode([sp_tok.vocab_size])
  with pytest.raises(ValueError, match="one sequence"):
    sp_tok.decode([ids, ids])


def test_sentencepiece_chat_template(sp_tok):
  messages = [{"role": "system", "content": "Be brief."},
              {"role": "user", "content": "What is 12 + 7?"},
              {"role": "assistant", "content": "19"},
              {"role": "user", "content": "And 1 + 1?"}]
  assert sp_tok.apply_chat_template(messages) == (
      "System: Be brief.\nUser: What is 12 + 7?\nAssistant: 19\nUser: And 1 + 1?\n"
      "Assistant:")
  assert sp_tok.apply_chat_template(messages[:2], add_generation_prompt=False) == (
      "System: Be brief.\nUser: What is 12 + 7?\n")
  assert sp_tok.apply_chat_template([{"role": "tool", "content": "3 passed"}]) == (
      "Tool: 3 passed\nAssistant:")
  with pytest.raises(ValueError, match=r"messages\[0\]\['role'\]"):
    sp_tok.apply_chat_template([{"role": "robot", "content": "x"}])


def test_sentencepiece_cache_reuses_model(tmp_path, counted_training):
  texts = math_corpus(seed=1, n=50)
  first = tk.SentencePieceTokenizer.train(iter(texts), 300, str(tmp_path))
  mtime = os.stat(first.model_file).st_mtime_ns
  assert counted_training == [300]
  again = tk.SentencePieceTokenizer.train(iter(texts), 300, str(tmp_path))
  assert counted_training == [300], "the cached model was retrained"
  assert again.model_file == first.model_file
  assert os.stat(again.model_file).st_mtime_ns == mtime
  assert again.encode(texts[0]) == first.encode(texts[0])

  other_corpus = tk.SentencePieceTokenizer.train(math_corpus(seed=2, n=50), 300,
                                                 str(tmp_path))
  other_vocab = tk.SentencePieceTokenizer.train(texts, 310, str(tmp_path))
  # Same characters, split differently: the key must see text boundaries.
  regrouped = tk.SentencePieceTokenizer.train(["".join(texts)], 300, str(tmp_path))
  assert counted_training == [300, 300, 310, 300]
  paths = {first.model_file, other_corpus.model_file, other_vocab.model_file,
           regrouped.model_file}
  assert len(paths) == 4
  assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths)


def test_sentencepiece_errors(tmp_path):
  with pytest.raises(ValueError, match="256 bytes"):
    tk.SentencePieceTokenizer.train(math_corpus(n=10), 200, str(tmp_path))
  with pytest.raises(ValueError, match="no training text"):
    tk.SentencePieceTokenizer.train(["", ""], 400, str(tmp_path))
  with pytest.raises(FileNotFoundError):
    tk.SentencePieceTokenizer(str(tmp_path / "missing.model"))
  assert not [f for f in os.listdir(tmp_path) if f.endswith(".model")]


def test_batch_encode_pads_with_pad_id(sp_tok):
  texts = ["1 + 1", "What is 12 + 7? Answer: 19"]
  rows = [sp_tok.encode(t) for t in texts]
  ids, lengths = tk.batch_encode(sp_tok, texts)
  n = len(rows[1])
  assert ids.shape == (2, n) and ids.dtype == np.int32
  np.testing.assert_array_equal(lengths, [len(rows[0]), n])
  assert ids[0].tolist() == [sp_tok.pad_id] * (n - len(rows[0])) + rows[0]
  assert ids[1].tolist() == rows[1]
  right, _ = tk.batch_encode(sp_tok, texts, length=n + 2, left_pad=False)
  assert right[0].tolist() == rows[0] + [sp_tok.pad_id] * (n + 2 - len(rows[0]))
  assert [sp_tok.decode(r) for r in right] == texts
  with pytest.raises(ValueError, match="text 1 has"):
    tk.batch_encode(sp_tok, texts, length=n - 1)


# ---------------------------------------------------------------------------------------
# Hugging Face


def raw_bpe(with_bos: bool = False) -> RawTokenizer:
  """A byte-level BPE trained here: ChatML specials (ids 0, 1, 2), a pad (3), a BOS (4).

  `with_bos` adds a post-processor that prepends BOS, as Llama tokenizers do.
  """
  tok = RawTokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=400,
      special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>", "<s>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(math_corpus(), trainer)
  if with_bos:
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 4)])
  return tok


def save_hf(path, pad: bool, generation_eos=None,
            with_bos: bool = False) -> transformers.PreTrainedTokenizerFast:
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=raw_bpe(with_bos), eos_token="<|endoftext|>",
      **({"pad_token": "<pad>"} if pad else {}), **({"bos_token": "<s>"} if with_bos else {}))
  fast.chat_template = CHATML
  fast.save_pretrained(str(path))
  if generation_eos is not None:
    with open(os.path.join(path, "generation_config.json"), "w") as f:
      json.dump({"eos_token_id": generation_eos}, f)
  return fast


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("hf")
  save_hf(path, pad=True)
  return str(path)


def test_hf_round_trip_matches_underlying_tokenizer(hf_dir):
  tok = tk.HFTokenizer.from_dir(hf_dir)
  assert isinstance(tok, tk.Tokenizer)
  raw = raw_bpe()
  assert tok.vocab_size == raw.get_vocab_size()
  for text in ["What is 12 + 7? Answer: 19", "  two  spaces\nnew line é",
               "<|im_start|>user\nhi<|im_end|>\n"]:
    ids = tok.encode(text)
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text
  assert tok.encode("<|im_end|>") == [2]


def test_hf_special_and_stop_ids(hf_dir):
  tok = tk.HFTokenizer.from_dir(hf_dir)
  assert (tok.eos_id, tok.pad_id, tok.bos_id) == (0, 3, None)
  # eos, plus the end-of-turn token the chat template closes turns with.
  assert tok.stop_ids == (0, 2)
  assert tok.encode("1 + 1", add_bos=True) == tok.encode("1 + 1")  # no BOS: a no-op
  ids = tok.encode("1 + 1")
  assert tok.decode([3, 3] + ids + [0]) == "1 + 1<|endoftext|>"


def test_hf_pad_falls_back_to_eos_and_generation_config_stops(tmp_path):
  save_hf(tmp_path, pad=False, generation_eos=[2, 1])
  tok = tk.HFTokenizer.from_dir(str(tmp_path))
  assert tok.pad_id == tok.eos_id == 0
  assert tok.stop_ids == (0, 2, 1)
  # A pad that is also eos is text (it ends turns): decode keeps it.
  text = "<|im_start|>user\n1 + 1<|im_end|>\n<|endoftext|>"
  assert tok.decode(tok.encode(text)) == text


def test_hf_bos_is_added_only_when_asked(tmp_path):
  fast = save_hf(tmp_path, pad=True, with_bos=True)
  tok = tk.HFTokenizer.from_dir(str(tmp_path))
  text = "What is 12 + 7?"
  assert fast.encode(text)[0] == 4  # the tokenizer itself would prepend BOS
  assert tok.bos_id == 4
  plain = tok.encode(text)
  assert plain == raw_bpe().encode(text).ids and 4 not in plain
  assert tok.encode(text, add_bos=True) == [4] + plain
  assert tok.encode("<s>" + text, add_bos=True) == [4] + plain  # not doubled


def test_hf_chat_template_matches_transformers(hf_dir):
  tok = tk.HFTokenizer.from_dir(hf_dir)
  direct = transformers.AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
  messages = [{"role": "user", "content": "What is 12 + 7?"},
              {"role": "assistant", "content": "19"},
              {"role": "user", "content": "And 2 + 2?"}]
  for gen in (True, False):
    ours = tok.apply_chat_template(messages, add_generation_prompt=gen)
    assert ours == direct.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=gen)
  assert tok.apply_chat_template(messages[:1]) == (
      "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n")
  prompt = tok.apply_chat_template(messages)
  assert tok.decode(tok.encode(prompt)) == prompt


def test_hf_missing_directory_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    tk.HFTokenizer.from_dir(str(tmp_path / "nope"))
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="no tokenizer files"):
    tk.HFTokenizer.from_dir(str(tmp_path))


# ---------------------------------------------------------------------------------------
# gin factory


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_make_tokenizer_from_gin(clean_gin, hf_dir, tmp_path, counted_training):
  gin.parse_config(["tokenizers.make_tokenizer.kind = 'hf'",
                    f"tokenizers.make_tokenizer.hf_dir = '{hf_dir}'"])
  hf = tk.make_tokenizer()
  assert isinstance(hf, tk.HFTokenizer) and hf.stop_ids == (0, 2)

  gin.clear_config()
  gin.parse_config(["tokenizers.make_tokenizer.vocab_size = 320",
                    f"tokenizers.make_tokenizer.cache_dir = '{tmp_path}'"])
  sp = tk.make_tokenizer(math_corpus(n=50))
  assert isinstance(sp, tk.SentencePieceTokenizer) and counted_training == [320]
  assert os.path.dirname(sp.model_file) == str(tmp_path)
  with pytest.raises(ValueError, match="training"):
    tk.make_tokenizer()
  with pytest.raises(ValueError, match="expected one of"):
    tk.make_tokenizer(["x"], kind="tiktoken")
