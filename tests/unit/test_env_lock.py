"""requirements.lock pins every package `make install` installs, agrees with pyproject.toml's ranges, and the check
that an environment equals it reports every difference."""

from __future__ import annotations

import hashlib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from resfl_lightning.analysis.checkout import lock_hash
from resfl_lightning.env_lock import LOCK, differences, main, parse_lock

tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml with tomllib")

HAND_MADE = """\
#
#    make lock
#
--extra-index-url file:///somewhere/simple
Torch==2.14.1
    # via
    #   lightning
numpy==2.4.6 ; python_version >= "3.11"
ruff[extra]==0.17.6 \\
    --hash=sha256:0123abcd
zope.interface==7.0  # a comment after the pin

# The following packages are considered to be unsafe in a requirements file:
setuptools==84.2.1
"""


def pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((LOCK.parent / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def test_parse_lock_reads_pins_and_skips_comments_options_markers_and_hashes():
    assert parse_lock(HAND_MADE) == {"torch": "2.14.1", "numpy": "2.4.6", "ruff": "0.17.6", "zope-interface": "7.0",
                                     "setuptools": "84.2.1"}


@pytest.mark.parametrize("text", ["numpy>=2\n", "numpy==\n", "numpy==2.4.6\nNumPy==2.4.6\n"])
def test_parse_lock_rejects_a_range_an_empty_pin_and_a_second_pin(text):
    with pytest.raises(ValueError, match="lock line"):
        parse_lock(text)


def test_differences_names_each_missing_other_version_and_unlocked_package():
    locked = parse_lock(HAND_MADE)
    installed = {"torch": "2.14.1", "numpy": "2.4.5", "ruff": "0.17.6.0", "setuptools": "65.5.0",
                 "requests": "2.34.2", "pip": "23.2.1", "wheel": "0.48.0", "resfl-lightning": "0.1.0"}
    assert differences(locked, installed) == [
        "numpy: 2.4.5 installed, 2.4.6 locked",
        "requests==2.34.2 is installed but not in the lock",
        "setuptools: 65.5.0 installed, 84.2.1 locked",  # the venv's own copy counts once the lock pins it
        "zope-interface==7.0 is locked but not installed",
    ]  # ruff 0.17.6.0 is 0.17.6; pip, wheel and the project itself are not the lock's to pin
    exact = dict(locked, pip="23.2.1", wheel="0.48.0", **{"resfl-lightning": "0.1.0"})
    assert differences(locked, exact) == []


def test_main_prints_every_difference_and_fails(tmp_path, monkeypatch, capsys):
    lock = tmp_path / "requirements.lock"
    lock.write_text(HAND_MADE)
    monkeypatch.setattr("resfl_lightning.env_lock.installed_distributions", lambda: {"torch": "2.13.0"})
    assert main(["--lock", str(lock)]) == 1
    out = capsys.readouterr().out
    assert "torch: 2.13.0 installed, 2.14.1 locked" in out and "numpy==2.4.6 is locked but not installed" in out
    monkeypatch.setattr("resfl_lightning.env_lock.installed_distributions", lambda: parse_lock(HAND_MADE))
    assert main(["--lock", str(lock)]) == 0
    assert "environment == requirements.lock (5 packages)" in capsys.readouterr().out


def test_the_lock_pins_every_pyproject_requirement_inside_its_range():
    locked = parse_lock(LOCK.read_text())
    for req in pyproject_requirements():
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is in pyproject.toml but not in requirements.lock: run `make lock`"
        assert req.specifier.contains(locked[name], prereleases=True), \
            f"requirements.lock pins {name}=={locked[name]}, outside pyproject.toml's {req}: run `make lock`"
    assert {"torch", "torchvision", "nvidia-cublas"} <= locked.keys()  # transitive packages are pinned too
    assert "#    make lock" in LOCK.read_text().splitlines()[:6]  # the header names the command that rewrites it


def test_lock_hash_is_the_sha256_prefix_of_the_lock_bytes(tmp_path):
    assert lock_hash() == hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    other = tmp_path / "requirements.lock"
    other.write_bytes(LOCK.read_bytes() + b"\n")
    assert lock_hash(other) != lock_hash() and len(lock_hash(other)) == 12
    assert lock_hash(tmp_path / "absent.lock").startswith("unknown")
