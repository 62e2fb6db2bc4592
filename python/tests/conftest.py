"""Shared fixtures: paths of the source tree, the CLI and the shipped model."""

import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("VQ_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
DATA = SOURCE_DIR / "data"
MODEL = DATA / "stories260K.bin"
TOKENIZER = DATA / "tok512.bin"
TEXT = DATA / "tinystories_validation_excerpt.txt"


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("VQ_CLI")
    if not path or not os.path.exists(path):
        pytest.skip("VQ_CLI (the veloxquant binary) not given; run through ctest")
    return path


@pytest.fixture(scope="session")
def libveloxquant(cli):
    """libveloxquant.so next to the CLI in the build tree, through ctypes."""
    import ctypes

    lib = pathlib.Path(cli).parent / "libveloxquant.so"
    if not lib.exists():
        pytest.skip("libveloxquant.so not built")
    return ctypes.CDLL(str(lib))
