"""What a Dockerfile puts into its image from the build context, read from its own COPY/ADD lines and
its .dockerignore, and digests of it.

Why: a record of a verified image build (tests/data/gpu_image_verified.json) stands for a tree only
while every input of that build is unchanged. The inputs are derived from the Dockerfile, not listed
by hand, so a new COPY line is covered the day it is written. Each COPY/ADD source is expanded as
Docker expands it (directories recursively, wildcards per path segment, files that .dockerignore
excludes left out: Docker's rules, a pattern anchored at the context's root, a match on a parent
folder excluding what is under it, `!` re-including, the last matching line deciding) and hashed by
path and content. The image is split where its dependencies end (the RUN that installs the project's
extra, `pip install ".[EXTRA]"`): the "dependency stage" is everything up to that RUN, the "code
stage" what follows, so that a record can say which of its checks a change of the code leaves
standing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# `pip install ... ".[gpu]"` (or '.[cpu]', .[x,y]): where a Dockerfile's dependency stage ends.
DEPENDENCY_INSTALL = re.compile(r"pip3?\s+install\b[^&;|]*?\s[\"']?\.\[[\w,-]+\][\"']?")
HEREDOC = re.compile(r"<<-?\s*[\"']?[A-Za-z_]")
REMOTE = re.compile(r"^(https?://|git@|git://)")
# COPY/ADD flags that leave the sources as context paths (--from takes them from elsewhere).
PLAIN_FLAGS = {"chown", "chmod", "link", "keep-git-dir", "checksum"}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int

    def text(self) -> str:
        return f"{self.keyword} {self.args}"


def instructions(text: str) -> list[Instruction]:
    """A Dockerfile's instructions, continuation lines joined, comments and blank lines dropped."""
    if re.match(r"\s*#\s*escape\s*=", text):
        raise ValueError("the escape parser directive is not read here: keep the backslash")
    out: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and (not stripped or stripped.startswith("#")):
            continue  # blank and comment lines inside a continued instruction are dropped, as Docker drops them
        start = start if pending else number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        pending = ""
        if HEREDOC.search(args):
            raise ValueError(f"line {start}: heredocs are not read here")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    if pending:
        raise ValueError("the Dockerfile ends inside a continued instruction")
    return out


def copy_sources(instruction: Instruction) -> list[str]:
    """The build-context paths a COPY or ADD brings into the image ([] for other instructions and
    for COPY --from, whose files come from another image or stage)."""
    if instruction.keyword not in ("COPY", "ADD"):
        return []
    args = instruction.args
    words: list[str] = []
    while args.startswith("--"):
        flag, _, args = args.partition(" ")
        words.append(flag)
        args = args.strip()
    for flag in words:
        name = flag[2:].split("=", 1)[0]
        if name == "from":
            return []
        if name not in PLAIN_FLAGS:
            raise ValueError(f"line {instruction.line}: {flag} is not understood here: say how it changes the inputs")
    paths = json.loads(args) if args.startswith("[") else args.split()
    if len(paths) < 2:
        raise ValueError(f"line {instruction.line}: {instruction.text()} names no source")
    sources = paths[:-1]
    for src in sources:
        if REMOTE.match(src):
            raise ValueError(f"line {instruction.line}: {src} is not in the build context: its content cannot be digested")
    return sources


# --- .dockerignore -------------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnorePattern:
    regex: re.Pattern
    exclusion: bool  # a `!` line: re-includes what it matches


def clean(path: str) -> str:
    """Go's filepath.Clean on a slash path, relative to the context's root."""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/".join(parts)


def pattern_regex(pattern: str) -> re.Pattern:
    """Docker's translation of a .dockerignore pattern (moby's patternmatcher)."""
    out, i = "^", 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            if pattern[i + 1:i + 2] == "*":
                i += 1
                if pattern[i + 1:i + 2] == "/":
                    i += 1
                out += ".*" if i + 1 >= len(pattern) else "(.*/)?"
            else:
                out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif ch == "[" and "]" in pattern[i + 1:]:
            close = pattern.index("]", i + 1)
            out += pattern[i:close + 1]  # a character class, as Go writes it
            i = close
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out + "$")


def ignore_patterns(text: str) -> list[IgnorePattern]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        pattern = clean(line[1:].strip() if exclusion else line)
        if pattern:
            out.append(IgnorePattern(pattern_regex(pattern), exclusion))
    return out


def ignored(rel: str, patterns: list[IgnorePattern]) -> bool:
    """Whether Docker leaves the context path out: the last pattern matching it or a parent decides."""
    parents = rel.split("/")
    candidates = ["/".join(parents[:n]) for n in range(1, len(parents) + 1)]
    verdict = False
    for pattern in patterns:
        if any(pattern.regex.match(path) for path in candidates):
            verdict = not pattern.exclusion
    return verdict


def dockerignore(context: Path, dockerfile: str) -> list[IgnorePattern]:
    """`<Dockerfile>.dockerignore` beside the Dockerfile when there is one, as BuildKit reads it, else
    the context's .dockerignore."""
    for path in (context / f"{dockerfile}.dockerignore", context / ".dockerignore"):
        if path.is_file():
            return ignore_patterns(path.read_text())
    return []


# --- expanding sources --------------------------------------------------------------------------


def walk(context: Path, rel: str) -> list[str]:
    """Every file (and symlink) at or under a context path, context-relative."""
    top = context / rel if rel else context
    if top.is_symlink() or top.is_file():
        return [rel]
    found = []
    for root, dirs, files in os.walk(top):
        base = Path(root).relative_to(context).as_posix()
        base = "" if base == "." else base + "/"
        found += [base + name for name in files]
        found += [base + name for name in dirs if (Path(root) / name).is_symlink()]
    return found


def matches(context: Path, source: str) -> list[str]:
    """The context paths a source names: itself, or what its wildcards match segment by segment."""
    source = clean(source)
    if not re.search(r"[*?\[]", source):
        return [source] if source == "" or os.path.lexists(context / source) else []
    found = [""]
    for segment in source.split("/"):
        step = []
        for base in found:
            folder = context / base if base else context
            if not folder.is_dir():
                continue
            names = sorted(os.listdir(folder))
            step += [f"{base}/{n}" if base else n for n in names if fnmatch.fnmatchcase(n, segment)]
        found = step
    return found


def source_files(context: Path, source: str, patterns: list[IgnorePattern]) -> list[str]:
    """The files a COPY source brings from the context, .dockerignore applied, sorted."""
    roots = matches(context, source)
    if not roots:
        raise FileNotFoundError(f"{source}: no such path in the build context {context}")
    return sorted({f for root in roots for f in walk(context, root) if not ignored(f, patterns)})


def file_bytes(path: Path) -> bytes:
    return b"symlink:" + os.readlink(path).encode() if path.is_symlink() else path.read_bytes()


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def combine(hashes: Mapping[str, str]) -> str:
    """One sha256 over named sha256s, sorted by name: deterministic whatever the order they came in."""
    h = hashlib.sha256()
    for name in sorted(hashes):
        h.update(name.encode() + b"\0" + hashes[name].encode() + b"\n")
    return h.hexdigest()


# --- an image's inputs ----------------------------------------------------------------------------


def dependency_stage_end(instrs: list[Instruction]) -> int:
    """How many instructions make the dependency stage: up to the RUN that installs the project's
    extra; all of them when there is no such RUN (then every change is a dependency change)."""
    for index, instr in enumerate(instrs):
        if instr.keyword == "RUN" and DEPENDENCY_INSTALL.search(instr.args):
            return index + 1
    return len(instrs)


def code_stage(context: Path, dockerfile: str) -> list[str]:
    """The instructions after the dependency stage, as written."""
    instrs = instructions((context / dockerfile).read_text())
    return [instr.text() for instr in instrs[dependency_stage_end(instrs):]]


@dataclass(frozen=True)
class ImageInputs:
    """Digests of an image's inputs, for the whole image and for its dependency stage, with one sha256
    per input (the Dockerfile, each extra file, each COPY/ADD source as written: its files by path and
    content) so that a change can be named."""

    image: dict[str, str]
    dependencies: dict[str, str]
    files: tuple[str, ...]  # every context file the image copies

    @property
    def image_sha256(self) -> str:
        return combine(self.image)

    @property
    def dependencies_sha256(self) -> str:
        return combine(self.dependencies)


def dependency_stage_name(dockerfile: str) -> str:
    return f"{dockerfile} (dependency stage)"


def image_inputs(context: Path, dockerfile: str = "Dockerfile", extra: tuple[str, ...] = (),
                 normalize: Mapping[str, Callable[[bytes], bytes]] | None = None) -> ImageInputs:
    """The inputs of `docker build -f DOCKERFILE CONTEXT`: the Dockerfile, the `extra` files (what else
    decides the build, e.g. the script that makes its base) and every file its COPY/ADD lines take from
    the context. `normalize` maps a path to the part of its content the image depends on."""
    normalize = normalize or {}

    def read(rel: str) -> str:
        return sha256(normalize.get(rel, lambda b: b)(file_bytes(context / rel)))

    text = (context / dockerfile).read_text()
    instrs = instructions(text)
    end = dependency_stage_end(instrs)
    patterns = dockerignore(context, dockerfile)
    extras = {rel: read(rel) for rel in extra}
    image = {dockerfile: sha256(text.encode()), **extras}
    stage = "\n".join(instr.text() for instr in instrs[:end])
    dependencies = {dependency_stage_name(dockerfile): sha256(stage.encode()), **extras}
    files: set[str] = set()
    for index, instr in enumerate(instrs):
        for source in copy_sources(instr):
            found = source_files(context, source, patterns)
            files.update(found)
            image[source] = combine({rel: read(rel) for rel in found})
            if index < end:
                dependencies[source] = image[source]
    return ImageInputs(image=image, dependencies=dependencies, files=tuple(sorted(files)))
