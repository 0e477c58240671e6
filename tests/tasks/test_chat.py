"""The multi-turn chat layouts (tasks/chat.py): the plain layout equals a from-scratch
tokenizer's template, and a Hugging Face template's pieces rebuild what the template itself
renders for a whole episode."""

import pytest
import transformers

from evotrainer import tokenizers as tk
from evotrainer.tasks import chat
from tests.test_tokenizers import CHATML, math_corpus, save_hf

SYSTEM = "Fix the bug."


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
  path = tmp_path_factory.mktemp("hf")
  save_hf(path, pad=True, generation_eos=[2])  # <|im_end|> (id 2) ends a turn too
  return tk.HFTokenizer.from_dir(str(path))


def test_the_plain_layout_is_the_sentencepiece_template(tmp_path):
  sp = tk.SentencePieceTokenizer.train(iter(math_corpus(n=50)), 300, str(tmp_path))
  derived = chat.ChatFormat.from_tokenizer(SYSTEM, sp)
  assert (derived.turn_prefix, derived.before, derived.after) == chat.PLAIN
  plain = chat.ChatFormat(SYSTEM)
  assert derived.prompt("issue") == plain.prompt("issue") == (
      "System: Fix the bug.\nUser: issue\nAssistant:")
  assert plain.observation("3 passed") == "\nTool: 3 passed\nAssistant:"
  assert isinstance(chat.for_tokenizer(SYSTEM, sp), chat.ChatFormat)
  assert chat.for_tokenizer(SYSTEM, sp).plain
  assert derived.end_of_turn == plain.end_of_turn == ""  # plain turns need no closing


def test_a_hugging_face_template_rebuilds_the_episode_it_renders(hf_tok):
  fmt = chat.for_tokenizer(SYSTEM, hf_tok)
  assert not fmt.plain
  assert fmt.turn_prefix == "" and fmt.before == "\n<|im_start|>tool\n"
  assert fmt.after == "<|im_end|>\n<|im_start|>assistant\n"
  assert fmt.end_of_turn == "<|im_end|>"  # closes a turn cut without its stop id
  # The engine's text of an episode: prompt, turn, its sampled end-of-turn token,
  # observation, turn, end-of-turn; the template renders the same messages identically.
  eot = "<|im_end|>"
  ours = (fmt.prompt("the issue") + fmt.turn("read a.py") + eot + fmt.observation("1: x")
          + fmt.turn("submit") + eot)
  messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "the issue"},
              {"role": "assistant", "content": "read a.py"}, {"role": "tool", "content": "1: x"},
              {"role": "assistant", "content": "submit"}]
  assert ours + "\n" == hf_tok.apply_chat_template(messages, add_generation_prompt=False)
  transcript = "read a.py" + fmt.observation("two\nlines") + "submit"
  assert fmt.split_turns(transcript) == ["read a.py", "submit"]
  assert fmt.split_turns("one turn") == ["one turn"]


def test_templates_that_cannot_run_an_episode_are_refused(tmp_path):
  no_tool = CHATML.replace("{% for m in messages %}", "{% for m in messages %}{% if m['role'] "
                           "== 'tool' %}{{ raise_exception('no tool role') }}{% endif %}")
  reversed_ = ("{% for m in messages|reverse %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
               "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
               "{% endif %}")
  for template, message in ((no_tool, "cannot render"), (reversed_, "extends the prompt")):
    fast = save_hf(tmp_path, pad=True)
    fast.chat_template = template
    fast.save_pretrained(str(tmp_path))
    tok = tk.HFTokenizer.from_dir(str(tmp_path))
    with pytest.raises(ValueError, match=message):
      chat.ChatFormat.from_tokenizer(SYSTEM, tok)
