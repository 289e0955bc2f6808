"""Where a vLLM engine's failure says why: the engine processes' output caught in a file, and the
worker's own error read back from it (vLLM's parent process raises only "see the root cause above")."""

import logging
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def stderr_to(path: Path):
    """The process's stdout and stderr (and so the engine processes', which inherit them) into
    ``path``: where vLLM's log has a worker's root cause when the parent only raises "see the root
    cause above"."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        # this process's vLLM log goes to the stream its handler was made with (pytest's capture, not fd 1)
        handler = logging.StreamHandler(f)
        logging.getLogger("vllm").addHandler(handler)
        try:
            yield
        finally:
            logging.getLogger("vllm").removeHandler(handler)
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)


def root_cause(log: Path, err: BaseException, *earlier: Path) -> str:
    """The worker's own error from the engine's log (a module vLLM's model file could not import
    first, also from ``earlier`` logs: vLLM inspects a model class once per process), else the
    exception's first line."""
    text = "\n".join(p.read_text(errors="replace") for p in (*earlier, log))
    found = (
        re.findall(r"(No module named '[^']+')", text)
        or re.findall(r"Worker failed with error '([^']+)'", text)
        or re.findall(r"Value error, (.+?)(?: \[type=|$)", str(err))
        or re.findall(r"^\S*(?:Error|Exception): (.+)$", text, re.M)
    )
    return (found[-1] if found else str(err).splitlines()[0]).strip()
