"""One SWE episode's state: each turn's call and observation, and why it stopped.

`SweEpisode.step(text)` takes one model turn: parses the call (`tools.parse_call`), runs
it on the episode's `Workspace`, records a `Turn`, and decides whether the episode stops.
Stop reasons (docs/method.md#stop-reasons; the multi-turn sampler adds its token budgets):
  submitted   the model called `submit`
  max_turns   `Budget.max_turns` turns taken without submitting
  tool_error  `Budget.max_errors` invalid calls in a row (malformed, unknown tool, bad
              argument, refused path, a search text not found once)
  echo_trap   the same call (name and arguments) `Budget.echo_k` times in a row
No model text can make `step` raise: every fault is an observation.

`info()` is what goes into `types.Episode.info` in the harness's conventions:
`turns` (count), `tool_calls` (one dict per parsed call of a known tool: `name`,
`turn`, `args`, `ok`), `stop`, `submitted`, `refused_paths`, `git_internals` (refused
paths into `.git`, counted among `refused_paths` too). `reward_parts(grade, ep)` is
the task's reward parts: `correct` (resolved, SWE-bench's BC), `partial` (F2P fraction,
CR), `tamper` (the grader's `Grade.tampered`; validators.TestTampering fails on it),
`tool_validity` (valid calls / turns), and a behaviour bonus to weigh in as an option,
`tested_before_submit` (a `run_tests` call ran before the submit).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from evotrainer.tasks.swe import tools as tools_lib
from evotrainer.tasks.swe.repo import Grade

STOPS = ("submitted", "max_turns", "tool_error", "echo_trap")


@dataclasses.dataclass(frozen=True)
class Budget:
  """Episode budgets.

  Attributes:
    max_turns: model turns at most.
    max_errors: consecutive invalid calls that end the episode (`tool_error`).
    echo_k: consecutive identical calls that end the episode (`echo_trap`).
    submit_after_edit: the harness submits for the model once an edit
      (`tools.EDIT_TOOLS`) has changed a file: the episode stops as `submitted` and is
      graded on that change (a stop rule for a policy that fixes but never calls
      `submit`, and whose later turns could only undo the fix).
  """
  max_turns: int = 20
  max_errors: int = 3
  echo_k: int = 3
  submit_after_edit: bool = False


@dataclasses.dataclass
class Turn:
  """One model turn.

  Attributes:
    text: the model's text of the turn.
    call: the parsed call, None when it did not parse.
    observation: what the model is shown next.
    ok: the call parsed and ran without a tool error.
    refused_path: the call named a path outside the repository.
    git_internals: the refused path led into the repository's `.git` folder.
  """
  text: str
  call: Optional[tools_lib.ToolCall]
  observation: str
  ok: bool
  refused_path: bool = False
  git_internals: bool = False


@dataclasses.dataclass
class SweEpisode:
  """The state of one episode (turns so far, and the stop reason once it stopped)."""
  workspace: tools_lib.Workspace
  budget: Budget = Budget()
  turns: list = dataclasses.field(default_factory=list)  # [Turn]
  stop: Optional[str] = None

  @property
  def done(self) -> bool:
    return self.stop is not None

  def step(self, text: str) -> str:
    """Runs one model turn; returns the observation (the episode may stop)."""
    if self.done:
      raise RuntimeError(f"the episode stopped ({self.stop}); no more turns")
    call, refused, internals = None, False, False
    try:
      call = tools_lib.parse_call(text, self.workspace.tool_args)
      observation, ok = self.workspace.execute(call), True
    except tools_lib.CallError as e:
      observation, ok = f"error: {e}", False
      refused = isinstance(e, tools_lib.PathRefused)
      internals = isinstance(e, tools_lib.GitInternalsRefused)
    observation = tools_lib.cap(observation, self.workspace.config.max_output_chars)
    self.turns.append(Turn(text, call, observation, ok, refused, internals))
    self.stop = self._stop_reason()
    return observation

  def _stop_reason(self) -> Optional[str]:
    last = self.turns[-1]
    if last.ok and last.call is not None and (
        last.call.name == "submit" or
        self.budget.submit_after_edit and last.call.name in tools_lib.EDIT_TOOLS):
      return "submitted"
    k = self.budget.echo_k
    keys = [t.call.key() if t.call is not None else None for t in self.turns[-k:]]
    if len(keys) == k and keys[0] is not None and len(set(keys)) == 1:
      return "echo_trap"
    m = self.budget.max_errors
    if len(self.turns) >= m and not any(t.ok for t in self.turns[-m:]):
      return "tool_error"
    if len(self.turns) >= self.budget.max_turns:
      return "max_turns"
    return None

  def info(self) -> dict:
    """The episode's record for `types.Episode.info` (see the module docstring)."""
    calls = [{"name": t.call.name, "turn": i, "args": t.call.args, "ok": t.ok}
             for i, t in enumerate(self.turns) if t.call is not None]
    return {"turns": len(self.turns), "tool_calls": calls, "stop": self.stop,
            "submitted": self.stop == "submitted",
            "refused_paths": sum(t.refused_path for t in self.turns),
            "git_internals": sum(t.git_internals for t in self.turns)}


def tool_validity(episode: SweEpisode) -> float:
  """Share of the episode's turns whose call parsed and ran (0 with no turns)."""
  turns = episode.turns
  return sum(t.ok for t in turns) / len(turns) if turns else 0.0


def reward_parts(grade: Grade, episode: SweEpisode) -> dict:
  """The task's reward parts of a graded episode (see the module docstring)."""
  return {"correct": float(grade.resolved), "partial": float(grade.f2p_fraction),
          "tamper": float(grade.tampered), "tool_validity": tool_validity(episode),
          "tested_before_submit": float(tested_before_submit(episode))}


def tested_before_submit(episode: SweEpisode) -> bool:
  """Whether a `run_tests` call ran before the episode submitted (False: no submit)."""
  if episode.stop != "submitted":
    return False
  return any(t.ok and t.call is not None and t.call.name == "run_tests"
             for t in episode.turns[:-1])
