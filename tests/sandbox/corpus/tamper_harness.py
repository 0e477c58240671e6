# The candidate solution: at import it tries to rewrite the harness's tests (tests.py),
# the runner (main.py), the worker and the standard library, and to reach the worker
# through /proc; then it offers a wrong answer.
import glob
import os
attempts = []
def attempt(what, fn):
  try:
    fn()
    attempts.append(f"{what}: DONE")
  except Exception as e:
    attempts.append(f"{what}: {e.__class__.__name__}")
def overwrite(path, text="def test():\n  pass\n"):
  with open(path, "w") as f:
    f.write(text)
attempt("overwrite tests.py", lambda: overwrite("tests.py"))
attempt("chmod tests.py", lambda: os.chmod("tests.py", 0o666))
attempt("unlink tests.py", lambda: os.unlink("tests.py"))
attempt("rename tests.py", lambda: os.rename("tests.py", "old.py"))
attempt("overwrite main.py", lambda: overwrite("main.py"))
attempt("worker", lambda: overwrite("/opt/sandbox/worker.py", "raise SystemExit\n"))
attempt("stdlib", lambda: overwrite(os.__file__, ""))
for path in glob.glob("/proc/[0-9]*/mem"):
  attempt(path, lambda: open(path, "r+b").write(b"\0"))
attempt("pycache", lambda: os.makedirs("__pycache__/x"))
print("\n".join(attempts))
def add(a, b):
  return a - b
