"""Where the repository and its assets are, computed once for every module that reads them."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: app.py, metasd/, assets/
ASSETS = ROOT / "assets"
DRAFTERS_DIR = ASSETS / "drafters"  # trained drafters, their cards and costs.json
COSTS_FILE = DRAFTERS_DIR / "costs.json"
PRIORS_DIR = ASSETS / "priors"
DATASTORE_DIR = ASSETS / "datastore"
RUNS_DIR = ASSETS / "runs"
EXAMPLES_FILE = ASSETS / "examples.json"
# The specialists' data (metasd/training/corpus.py), kept in the repository: machines change between training
# sessions and only what is committed survives; the shards are token ids, about 35 KB for 64 answers.
CORPUS_DIR = ROOT / "data" / "corpus"
