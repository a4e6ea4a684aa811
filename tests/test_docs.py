"""Measured numbers live in docs/performance.md, not in the code; README tables stay one line a row (issue 42,
item 10; DESIGN.md: "Numbers measured on a GPU live in docs/performance.md with their commit")."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = (ROOT / "container", ROOT / "handlers")
GPU_NAMES = re.compile(r"H100|H200")
# (file, text of the comment or string) allowed to name one of those GPUs. Real code values (a preset's GPU
# match) would go here; none exist today. The one entry is a comment in the lead's engine.py, edited
# concurrently: its figure is already in docs/performance.md ("Engine scheduling"); drop the entry with it.
ALLOWED: set[tuple[str, str]] = set()  # (file, comment) pairs that may name a GPU; none today
MAX_ROW = 300  # characters of a README table row


def _comments_and_strings(path: Path):
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    kinds = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    for tok in tokens:
        if tok.type in kinds:
            yield tok.start[0], tok.string


def test_no_gpu_measurements_in_production_comments():
    found = []
    for top in PRODUCTION:
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, text in _comments_and_strings(path):
                if GPU_NAMES.search(text) and (rel, text) not in ALLOWED:
                    found.append(f"{rel}:{line}")
    assert found == [], f"GPU figures belong in docs/performance.md (keep the why in the code): {found}"


def test_readme_table_rows_are_one_line():
    long = [(n, len(line)) for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
            if line.startswith("|") and len(line) > MAX_ROW]
    assert long == [], f"README table rows over {MAX_ROW} characters (move the explanation to docs/): {long}"


def test_performance_sections_named_in_code_exist():
    headings = set(re.findall(r"^## (.+)$", (ROOT / "docs" / "performance.md").read_text(), flags=re.M))
    named = set()
    for top in (*PRODUCTION, ROOT / "docs"):
        for path in top.rglob("*"):
            if path.suffix in (".py", ".md"):
                for name in re.findall(r'docs/performance\.md,\s+"([^"]+)"', path.read_text()):
                    named.add(" ".join(w for w in name.split() if w != "#"))  # a name wrapped in a comment
    assert named and named <= headings, f"sections named but missing: {sorted(named - headings)}"


# ---- the README stays short and in step with the code (issue 47) ------------------------------------------------
README_MAX_LINES = 200


def test_readme_is_short_and_its_links_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "move the explanation to docs/ and link it"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    for target in set(re.findall(r"\bdocs/[\w.-]+\.md", readme)):
        assert (ROOT / target).is_file(), target


def test_readme_commands_match_the_code():
    """The commands the README and the deploy guides tell a user to run exist as written: subcommands, handler
    modes, the test command CI reads (.ci/run) and the quick marker beside it."""
    from handlers.__main__ import MODES
    from ttsengine.__main__ import TOOLS, build_parser

    texts = {p: p.read_text() for p in (ROOT / "README.md", *sorted((ROOT / "docs").glob("deploy-*.md")))}
    subcommands = set(TOOLS) | set(build_parser()._subparsers._group_actions[0].choices)
    for path, text in texts.items():
        for sub in re.findall(r"python -m ttsengine (\w+)", text):
            assert sub in subcommands, f"{path.name}: python -m ttsengine {sub}"
        for mode in re.findall(r"python -m handlers (\w+)", text):
            assert mode in MODES, f"{path.name}: python -m handlers {mode}"
        for script in re.findall(r"\b(scripts/[\w/.-]+\.sh)", text):
            assert (ROOT / script).is_file(), f"{path.name}: {script}"
    readme = texts[ROOT / "README.md"]
    run_tests = readme.split("## Run the tests", 1)[1]
    assert run_tests.split("```bash\n", 1)[1].splitlines()[0] == "python -m pytest"  # what .ci/run evals
    assert "README.md" in (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -m quick" in run_tests
    assert "quick:" in (ROOT / "pyproject.toml").read_text()
