"""Text <-> token ids: one `Tokenizer` protocol and its two implementations.

* `SentencePieceTokenizer` is trained in-process on the task's own text (byte fallback,
  digits split one per token, which helps arithmetic) and cached by a content hash, so a
  from-scratch policy gets a small vocabulary fitted to its task.
* `HFTokenizer` wraps the tokenizer stored next to a local Hugging Face checkpoint,
  including its own chat template and stop tokens.

`make_tokenizer` is the gin entry point (`tokenizers.make_tokenizer.kind = 'hf'`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from typing import Any, Iterable, Optional, Protocol, Sequence, runtime_checkable

import gin
import numpy as np
import sentencepiece as spm

from evotrainer import atomic


@runtime_checkable
class Tokenizer(Protocol):
  """What the rest of EvoTrainer needs from a tokenizer.

  Ids are plain Python ints in `[0, vocab_size)`. `pad_id` is always a real id (distinct
  from `eos_id` where the tokenizer has a pad token); `decode` drops it only when it is a
  token of its own, not also eos, bos or a stop id (callers cut padding off by length).
  `bos_id` is None for tokenizers without a BOS token (Qwen); `encode(..., add_bos=True)`
  is then a no-op.
  `stop_ids` are the ids that end a sampled turn: eos plus chat end-of-turn tokens.
  """

  @property
  def vocab_size(self) -> int:
    ...

  @property
  def bos_id(self) -> Optional[int]:
    ...

  @property
  def eos_id(self) -> int:
    ...

  @property
  def pad_id(self) -> int:
    ...

  @property
  def stop_ids(self) -> tuple[int, ...]:
    ...

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    """Token ids of `text`; with `add_bos`, BOS first unless the text already starts with it."""
    ...

  def decode(self, ids: Sequence[int]) -> str:
    """Text of the 1-D `ids`, a pad of its own dropped; it does not stop at eos.

    Cut a completion at its first stop id before decoding: other special tokens render as
    the library renders them (SentencePiece bos/eos as "", Hugging Face ones as their text).
    """
    ...

  def apply_chat_template(self, messages: list[dict],
                          add_generation_prompt: bool = True) -> str:
    """Renders `[{'role': ..., 'content': ...}, ...]` as prompt text (not ids)."""
    ...


def batch_encode(tokenizer: Tokenizer, texts: Sequence[str], *, add_bos: bool = False,
                 length: Optional[int] = None,
                 left_pad: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """Encodes and pads a batch of texts.

  Args:
    tokenizer: any `Tokenizer`.
    texts: B strings.
    add_bos: passed to `tokenizer.encode`.
    length: T, the padded length; the longest row when None.
    left_pad: pad on the left (prompts, so that generation continues every row at the
      same position) or on the right (targets).

  Returns:
    ids: int32 [B, T], filled with `tokenizer.pad_id`.
    lengths: int32 [B], the number of real tokens per row.
  """
  rows = [tokenizer.encode(t, add_bos=add_bos) for t in texts]
  lengths = np.asarray([len(r) for r in rows], np.int32)
  if length is None:
    length = int(lengths.max()) if rows else 0
  ids = np.full((len(rows), length), tokenizer.pad_id, np.int32)
  for i, row in enumerate(rows):
    if len(row) > length:
      raise ValueError(f"batch_encode: text {i} has {len(row)} tokens, more than "
                       f"length={length}: {texts[i][:80]!r}...")
    if row:
      if left_pad:
        ids[i, length - len(row):] = row
      else:
        ids[i, :len(row)] = row
  return ids, lengths


def _ids_without_pad(ids: Sequence[int], pad_id: Optional[int],
                     vocab_size: int) -> list[int]:
  """`ids` as Python ints with `pad_id` (None: nothing) dropped; out-of-range ids are an
  error, not skipped."""
  ids = np.asarray(ids)
  if ids.ndim != 1:
    raise ValueError(f"decode takes one sequence of ids, got an array of shape {ids.shape}")
  out = [int(i) for i in ids]
  bad = [i for i in out if not 0 <= i < vocab_size]
  if bad:
    raise ValueError(f"decode: ids {bad[:5]} are outside the vocabulary [0, {vocab_size}); "
                     "a model vocabulary padded past the tokenizer's must mask those logits")
  return [i for i in out if i != pad_id]


def _with_bos(ids: list[int], add_bos: bool, bos_id: Optional[int]) -> list[int]:
  if add_bos and bos_id is not None and (not ids or ids[0] != bos_id):
    return [bos_id] + ids
  return ids


# ---------------------------------------------------------------------------------------
# SentencePiece, trained on the task's text.

# Trainer options that make the model lossless (identity normalization, whitespace kept,
# no dummy prefix, bytes for unseen characters) and that fix the special ids.
_SP_OPTIONS = dict(
    byte_fallback=True,
    split_digits=True,
    character_coverage=1.0,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    # No "▁" is prepended: encode(a) + encode(b) == encode(a + b) at word boundaries, and a
    # completion decoded on its own keeps its leading space.
    add_dummy_prefix=False,
    allow_whitespace_only_pieces=True,
    # Small task corpora often cannot fill the requested vocabulary: take what they give.
    hard_vocab_limit=False,
    pad_id=0, unk_id=1, bos_id=2, eos_id=3,
    pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
    max_sentence_length=1 << 16,
    minloglevel=1,
)
# Bumped when the way a model is trained changes, so old cache entries are not reused.
_SP_CACHE_FORMAT = 1

_SP_ROLES = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}


def _sp_cache_key(texts: Sequence[str], options: dict) -> str:
  """sha256 of the trainer options, the sentencepiece version and every text."""
  h = hashlib.sha256()
  header = {"format": _SP_CACHE_FORMAT, "sentencepiece": spm.__version__, **options}
  h.update(json.dumps(header, sort_keys=True).encode())
  for text in texts:
    b = text.encode("utf-8")
    h.update(len(b).to_bytes(8, "little"))  # length-prefixed: ["ab"] != ["a", "b"]
    h.update(b)
  return h.hexdigest()


def _write_atomically(path: str, data: bytes) -> None:
  """Writes through a temporary file so concurrent trainers never expose a partial model."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  atomic.write_bytes(path, data)


class _SpecialIds:
  """The special-id properties both tokenizers share (set `_bos`, `_eos`, `_pad`)."""

  @property
  def bos_id(self) -> Optional[int]:
    return self._bos

  @property
  def eos_id(self) -> int:
    return self._eos

  @property
  def pad_id(self) -> int:
    return self._pad


class SentencePieceTokenizer(_SpecialIds):
  """A SentencePiece model: lossless round trip, digits split, byte fallback.

  Special ids of a model made by `train`: pad 0, unk 1, bos 2 (`<s>`), eos 3 (`</s>`).

  Chat template (plain text, one line per turn, no special tokens in the text):

      System: {content}
      User: {content}
      Assistant: {content}
      Assistant:                 <- the generation prompt

  Every turn ends with a newline; the generation prompt is "Assistant:" with no trailing
  space, so the answer's own first token carries it. The model ends its turn with eos
  (`stop_ids == (eos_id,)`).
  """

  def __init__(self, model_file: str):
    if not os.path.isfile(model_file):
      raise FileNotFoundError(f"SentencePiece model {model_file!r} does not exist")
    self.model_file = model_file
    self._sp = spm.SentencePieceProcessor(model_file=model_file)
    eos = self._sp.eos_id()
    if eos < 0:
      raise ValueError(f"SentencePiece model {model_file!r} has no eos piece (eos_id=-1); "
                       "train it with eos_id set")
    pad, bos = self._sp.pad_id(), self._sp.bos_id()
    self._eos = eos
    self._pad = pad if pad >= 0 else eos
    self._bos = bos if bos >= 0 else None

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int, cache_dir: str,
            user_defined_symbols: Sequence[str] = (),
            model_type: str = "bpe") -> SentencePieceTokenizer:
    """Trains on `texts` in memory, or reuses the model cached for the same inputs.

    The cache file is `cache_dir/spm-<sha256>.model`, keyed by the texts, `vocab_size`,
    `user_defined_symbols`, `model_type`, the fixed trainer options and the sentencepiece
    version. Training is deterministic, so hosts that each train reach the same model.

    Args:
      texts: training text (read once into memory: it is hashed, then trained on).
      vocab_size: upper bound on the vocabulary; a small corpus may give fewer pieces. It
        must exceed 4 specials + 256 bytes + the corpus's distinct characters + symbols.
      cache_dir: where trained models are kept.
      user_defined_symbols: strings always kept as one piece (e.g. "<think>").
      model_type: "bpe" (default: unigram learns almost nothing on small corpora) or
        "unigram".

    Returns:
      The tokenizer.
    """
    texts = list(texts)
    for i, t in enumerate(texts):
      if not isinstance(t, str):
        raise TypeError(f"SentencePieceTokenizer.train: texts[{i}] is {type(t).__name__}, "
                        "expected str")
    if not any(texts):
      raise ValueError("SentencePieceTokenizer.train: no training text (all empty)")
    if model_type not in ("bpe", "unigram"):
      raise ValueError(f"model_type={model_type!r}; expected 'bpe' or 'unigram'")
    options = dict(_SP_OPTIONS, vocab_size=int(vocab_size), model_type=model_type,
                   user_defined_symbols=list(user_defined_symbols))
    path = os.path.join(cache_dir, f"spm-{_sp_cache_key(texts, options)}.model")
    if not os.path.exists(path):
      buf = io.BytesIO()
      try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=buf,
                                       **options)
      except RuntimeError as e:
        raise ValueError(
            f"SentencePiece training failed for vocab_size={vocab_size} on {len(texts)} "
            "texts; with byte fallback the vocabulary must exceed 4 specials + 256 bytes + "
            f"every distinct character in the corpus: {e}") from e
      _write_atomically(path, buf.getvalue())
    return cls(path)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def stop_ids(self) -> tuple[int, ...]:
    return (self._eos,)

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    return _with_bos(self._sp.encode(text), add_bos, self._bos)

  def decode(self, ids: Sequence[int]) -> str:
    # Control pieces (bos, eos) decode to "" in SentencePiece.
    return self._sp.decode(_ids_without_pad(ids, self._pad, self.vocab_size))

  def apply_chat_template(self, messages: list[dict],
                          add_generation_prompt: bool = True) -> str:
    lines = []
    for i, m in enumerate(messages):
      role, content = m.get("role"), m.get("content")
      if role not in _SP_ROLES:
        raise ValueError(f"messages[{i}]['role']={role!r}; expected one of {tuple(_SP_ROLES)}")
      if not isinstance(content, str):
        raise TypeError(f"messages[{i}]['content'] is {type(content).__name__}, expected str")
      lines.append(f"{_SP_ROLES[role]}: {content}\n")
    if add_generation_prompt:
      lines.append(f"{_SP_ROLES['assistant']}:")
    return "".join(lines)


# ---------------------------------------------------------------------------------------
# Hugging Face, from a local checkpoint directory.

# Files of which at least one must be present for `AutoTokenizer` to build a tokenizer.
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json",
                       "vocab.txt", "tiktoken.model")
# End-of-turn tokens of common chat formats (ChatML/Qwen, Llama 3, Gemma, Phi-3). Base
# models often name only `<|endoftext|>` as eos yet their chat template closes turns with
# one of these; it must stop sampling too.
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")


def _generation_config_eos(path: str) -> list[int]:
  """`eos_token_id` (an int or a list) of `path/generation_config.json`, if any."""
  file = os.path.join(path, "generation_config.json")
  if not os.path.isfile(file):
    return []
  with open(file) as f:
    try:
      eos = json.load(f).get("eos_token_id")
    except json.JSONDecodeError as e:
      raise ValueError(f"{file} is not valid JSON: {e}") from e
  if eos is None:
    return []
  eos = eos if isinstance(eos, list) else [eos]
  if not all(isinstance(i, int) for i in eos):
    raise ValueError(f"{file}: eos_token_id={eos!r}; expected an int or a list of ints")
  return eos


class HFTokenizer(_SpecialIds):
  """A `transformers` tokenizer behind the `Tokenizer` protocol.

  Text is encoded without the tokenizer's automatic special tokens
  (`add_special_tokens=False`); special tokens written in the text (as chat templates do)
  are still recognised, and `add_bos` adds BOS explicitly. `decode` keeps special tokens,
  so `decode(encode(prompt)) == prompt` for templated prompts.
  """

  def __init__(self, tokenizer: Any, extra_stop_ids: Sequence[int] = (), name: str = ""):
    """Wraps `tokenizer` (a `PreTrainedTokenizerBase`).

    Args:
      tokenizer: the loaded tokenizer.
      extra_stop_ids: further ids that end a turn (generation_config's eos list).
      name: where it came from, for error messages.
    """
    self._tok = tokenizer
    self._name = name or type(tokenizer).__name__
    self._vocab_size = len(tokenizer)  # includes added tokens, unlike `.vocab_size`
    eos = tokenizer.eos_token_id
    if eos is None:
      eos = next(iter(extra_stop_ids), None)
    if eos is None:
      raise ValueError(f"tokenizer {self._name} has no eos token and no "
                       "generation_config.json eos_token_id: sampling could never stop")
    self._eos = int(eos)
    pad = tokenizer.pad_token_id
    self._pad = int(pad) if pad is not None else self._eos
    bos = tokenizer.bos_token_id
    self._bos = int(bos) if bos is not None else None

    stops = [self._eos, *map(int, extra_stop_ids)]
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    for token in _END_OF_TURN_TOKENS:
      if token in template:
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is not None and tid != tokenizer.unk_token_id:
          stops.append(int(tid))
    for i in stops:
      if not 0 <= i < self._vocab_size:
        raise ValueError(f"tokenizer {self._name}: stop id {i} is outside the vocabulary "
                         f"[0, {self._vocab_size})")
    self._stops = tuple(dict.fromkeys(stops))  # ordered, without duplicates
    # A pad that is also eos (ChatML GGUF files, base models without a pad token) ends
    # turns in the text: decode keeps it, so that decode(encode(x)) == x.
    self._dropped = None if self._pad in (*self._stops, self._bos) else self._pad

  @classmethod
  def from_dir(cls, path: str) -> HFTokenizer:
    """Loads the tokenizer saved in the local directory `path` (never downloads).

    Stop ids are the tokenizer's eos, `generation_config.json`'s `eos_token_id` list when
    the directory has one, and the end-of-turn token its chat template uses.
    """
    if not os.path.isdir(path):
      raise FileNotFoundError(f"Hugging Face tokenizer directory {path!r} does not exist "
                              "(it must be a local directory; nothing is downloaded)")
    if not any(os.path.isfile(os.path.join(path, f)) for f in _HF_TOKENIZER_FILES):
      raise FileNotFoundError(
          f"{path!r} has no tokenizer files; expected one of {_HF_TOKENIZER_FILES} "
          f"(found {sorted(os.listdir(path))[:20]})")
    import transformers  # slow to import; only this path needs it

    try:
      tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
      raise ValueError(f"could not load the tokenizer in {path!r}: {e}") from e
    return cls(tok, extra_stop_ids=_generation_config_eos(path), name=path)

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  @property
  def stop_ids(self) -> tuple[int, ...]:
    return self._stops

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    return _with_bos(list(self._tok.encode(text, add_special_tokens=False)), add_bos,
                     self._bos)

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode(_ids_without_pad(ids, self._dropped, self._vocab_size),
                            skip_special_tokens=False, clean_up_tokenization_spaces=False)

  def apply_chat_template(self, messages: list[dict],
                          add_generation_prompt: bool = True) -> str:
    if not self._tok.chat_template:
      raise ValueError(f"tokenizer {self._name} has no chat template "
                       "(tokenizer_config.json 'chat_template' or chat_template.jinja)")
    return self._tok.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


# ---------------------------------------------------------------------------------------

_DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "evotrainer", "tokenizers")
KINDS = ("sentencepiece", "hf")


@gin.configurable(module="tokenizers", denylist=["texts"])
def make_tokenizer(texts: Optional[Iterable[str]] = None, kind: str = "sentencepiece",
                   hf_dir: Optional[str] = None, vocab_size: int = 1024,
                   cache_dir: str = _DEFAULT_CACHE_DIR,
                   user_defined_symbols: Sequence[str] = ()) -> Tokenizer:
  """The tokenizer named by gin; the task passes its training `texts` at call time.

  Args:
    texts: text to train a SentencePiece model on (kind 'sentencepiece'); ignored for 'hf'.
    kind: 'sentencepiece' (trained here, cached) or 'hf' (the checkpoint's own).
    hf_dir: local directory holding the Hugging Face tokenizer (kind 'hf').
    vocab_size: upper bound on the SentencePiece vocabulary.
    cache_dir: where trained SentencePiece models are cached (`~` is expanded).
    user_defined_symbols: SentencePiece pieces kept whole.

  Returns:
    A `Tokenizer`.
  """
  if kind == "hf":
    if not hf_dir:
      raise ValueError("make_tokenizer(kind='hf') needs hf_dir "
                       "(gin: tokenizers.make_tokenizer.hf_dir = '/path/to/checkpoint')")
    return HFTokenizer.from_dir(hf_dir)
  if kind == "sentencepiece":
    if texts is None:
      raise ValueError("make_tokenizer(kind='sentencepiece') needs the task's training "
                       "texts (passed by the caller, not by gin)")
    return SentencePieceTokenizer.train(texts, vocab_size, os.path.expanduser(cache_dir),
                                        user_defined_symbols=user_defined_symbols)
  raise ValueError(f"tokenizers.make_tokenizer.kind={kind!r}; expected one of {KINDS}")
