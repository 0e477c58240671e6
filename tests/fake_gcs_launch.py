"""`--import=tests.fake_gcs_launch`: the launcher process (and the branch children it
starts, which inherit its imports) reads and writes `gs://` through tests/fake_gcs.py,
rooted at $EVO_FAKE_GCS_ROOT, for its whole life: a gs:// workdir end to end through the
real launcher, without a network."""

import os
import pathlib

from tests.fake_gcs import fake_gcs

_FAKE = fake_gcs(pathlib.Path(os.environ["EVO_FAKE_GCS_ROOT"]))
_FAKE.__enter__()  # never left: the process ends with it
