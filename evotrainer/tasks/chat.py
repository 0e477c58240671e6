"""How a multi-turn task's episode becomes text: the prompt, a model turn, an observation.

`ChatFormat(system)` is the plain layout for from-scratch tokenizers (the layout of
`SentencePieceTokenizer.apply_chat_template`, whose roles include `tool`):

    System: <system text>
    User: <the task>
    Assistant: <model turn 1, ended by the stop id>
    Tool: <observation 1>
    Assistant: <model turn 2> ...

`ChatFormat.from_tokenizer(system, tokenizer)` renders the same episode with the
tokenizer's own chat template (a Hugging Face checkpoint's `chat_template`): the prompt is
`apply_chat_template([system, user], add_generation_prompt=True)`, and the text between a
model turn and the next one is read off the template once, by rendering an episode whose
turn and observation are sentinels (`derive_pieces`). The model turn's end-of-turn token
is sampled (the engine keeps the sampled stop id), so the observation text starts after it.
A turn cut at the engine's token budget has no stop id: `ChatFormat.end_of_turn` (the
template's end-of-turn text, "" in the plain layout) is what the engine writes before
its observation, so the context stays well formed.
For a SentencePiece tokenizer the derived pieces equal the plain layout's (tested).
"""

from __future__ import annotations

import re
from typing import Optional

from evotrainer.tokenizers import HFTokenizer

_TURN, _OBSERVATION, _USER = "\x1eTURN\x1e", "\x1eOBSERVATION\x1e", "\x1eUSER\x1e"

# The plain layout: (text before a turn's words, text between a turn and its observation,
# text after the observation up to the next turn).
PLAIN = (" ", "\nTool: ", "\nAssistant:")


def chat_tokenizer(tokenizer) -> Optional[HFTokenizer]:
  """`tokenizer` when it renders prompts in its own chat template (a Hugging Face one, e.g.
  a pretrained policy's); None for a from-scratch tokenizer, which reads plain prompts."""
  return tokenizer if isinstance(tokenizer, HFTokenizer) else None


def user_turn(chat: Optional[HFTokenizer], text: str) -> str:
  """`text` as a user turn of `chat`'s template, open for the model's reply; `text` itself
  when `chat` is None (see `chat_tokenizer`)."""
  if chat is None:
    return text
  return chat.apply_chat_template([{"role": "user", "content": text}],
                                  add_generation_prompt=True)


def derive_pieces(tokenizer) -> tuple[str, str, str, str]:
  """(turn_prefix, before, after, end_of_turn) of `tokenizer`'s chat template: a model
  turn is `turn_prefix + words`, an observation `before + text + after` (see the module
  docstring); `end_of_turn` is the text of the stop id the template writes after a turn
  ("" when none does), which `before` starts after: the sampled stop id writes it.

  Raises:
    ValueError: the template does not render a tool message, or an episode's rendering
      does not extend its prompt (the layout then cannot be continued turn by turn).
  """
  name = getattr(tokenizer, "_name", type(tokenizer).__name__)
  base = [{"role": "system", "content": "S"}, {"role": "user", "content": _USER}]
  episode = base + [{"role": "assistant", "content": _TURN},
                    {"role": "tool", "content": _OBSERVATION}]
  try:
    prompt = tokenizer.apply_chat_template(base, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(episode, add_generation_prompt=True)
  except Exception as e:  # jinja raises its own errors for unsupported roles
    raise ValueError(f"the chat template of {name} cannot render a system, user, "
                     f"assistant and tool message ({type(e).__name__}: {e})") from e
  i, j = full.find(_TURN), full.find(_OBSERVATION)
  if i < 0 or j < i or not full[:i].startswith(prompt):
    raise ValueError(
        f"the chat template of {name} does not render an episode as its prompt followed "
        f"by the turns (prompt {prompt!r}, episode {full!r}); a multi-turn episode needs "
        f"a template that extends the prompt")
  before, after = full[i + len(_TURN):j], full[j + len(_OBSERVATION):]
  stops = (tokenizer.decode([s]) for s in tokenizer.stop_ids)
  closing = next((t for t in stops if t and before.startswith(t)), "")
  return full[len(prompt):i], before[len(closing):], after, closing


class ChatFormat:
  """A multi-turn task's text layout (module docstring).

  Args:
    system: the system message.
    pieces: (turn_prefix, before, after); None: the plain layout.
    tokenizer: renders the prompt with its chat template (None: the plain layout).
    end_of_turn: the text that closes a model turn cut without its stop id (the
      template's end-of-turn token; "" in the plain layout, whose turns need none).
  """

  def __init__(self, system: str, pieces: tuple = PLAIN, tokenizer=None,
               end_of_turn: str = ""):
    self.system = system
    self.turn_prefix, self.before, self.after = pieces
    self.end_of_turn = end_of_turn
    self._tok = tokenizer
    self._block = re.compile(re.escape(self.before) + ".*?" + re.escape(self.after), re.S)

  @classmethod
  def from_tokenizer(cls, system: str, tokenizer) -> "ChatFormat":
    *pieces, closing = derive_pieces(tokenizer)
    return cls(system, tuple(pieces), tokenizer, closing)

  @property
  def plain(self) -> bool:
    return self._tok is None

  def prompt(self, user: str) -> str:
    """The text before the first model turn."""
    if self._tok is None:
      return f"System: {self.system}\nUser: {user}\nAssistant:"
    return self._tok.apply_chat_template([{"role": "system", "content": self.system},
                                          {"role": "user", "content": user}],
                                         add_generation_prompt=True)

  def observation(self, text: str) -> str:
    """The text between a model turn (its stop id) and the next model turn."""
    return self.before + text + self.after

  def turn(self, words: str) -> str:
    """A model turn as the layout writes it (the words after the template's prefix)."""
    return self.turn_prefix + words

  def split_turns(self, transcript: str) -> list[str]:
    """The model turns of a transcript: the text between observation blocks (a text with
    no block is one turn). The observations written in the text are not read."""
    return self._block.split(transcript)


def for_tokenizer(system: str, tokenizer: Optional[object]) -> ChatFormat:
  """The tokenizer's own layout when it is a Hugging Face tokenizer, the plain layout
  otherwise (a from-scratch tokenizer's template is the plain layout)."""
  from evotrainer.tokenizers import HFTokenizer
  if isinstance(tokenizer, HFTokenizer):
    return ChatFormat.from_tokenizer(system, tokenizer)
  return ChatFormat(system)
