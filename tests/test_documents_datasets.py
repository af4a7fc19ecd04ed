"""Document sources read through the ``datasets`` library: a parquet file written here, a folder of them, a
``save_to_disk`` folder; streamed, with a reservoir-sampled pool; a recipe reads one like any other source."""

from __future__ import annotations

import random

import helpers
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from coevolve.config import ConfigError
from coevolve.documents import (
    DocumentError,
    check_document_source,
    dataset_source,
    load_documents,
    reservoir,
)

TEXTS = [f"Passage {i}: the sum of {i} and {i + 1} is {2 * i + 1}." for i in range(40)]


@pytest.fixture
def corpus(tmp_path):
    """A parquet file with a text column, a question column and an empty and a missing text among its rows."""
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": [*TEXTS, "", None], "question": [f"Q{i}?" for i in range(42)]}), path,
                   row_group_size=8)  # several row groups: the stream crosses them
    return path


def test_parquet_file_streams_its_text_column(corpus):
    assert dataset_source(str(corpus)) == (str(corpus), "text")
    pool = load_documents(str(corpus))
    assert pool.passages == TEXTS  # empty and missing texts dropped, order kept
    assert load_documents(f"{corpus}#question").passages == [f"Q{i}?" for i in range(42)]


def test_folder_of_parquet_files_and_save_to_disk_folder(tmp_path, corpus):
    import datasets

    folder = tmp_path / "repo" / "data"
    folder.mkdir(parents=True)
    for k in range(2):
        pq.write_table(pa.table({"text": TEXTS[20 * k:20 * k + 20]}), folder / f"train-{k:05d}-of-00002.parquet")
    assert load_documents(str(tmp_path / "repo")).passages == TEXTS
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": TEXTS[:5]}).save_to_disk(str(saved))
    assert dataset_source(str(saved)) == (str(saved), "text")
    assert load_documents(str(saved)).passages == TEXTS[:5]


def test_pool_limit_is_a_seeded_reservoir_in_stream_order(corpus):
    a = load_documents(str(corpus), limit=7, seed=1).passages
    assert a == load_documents(str(corpus), limit=7, seed=1).passages and len(a) == 7
    assert a != load_documents(str(corpus), limit=7, seed=2).passages
    assert a == sorted(a, key=TEXTS.index)  # stream order
    # Algorithm R is uniform: every one of 10 items is kept in about 3 of 10 draws of 3
    counts = [0] * 10
    for seed in range(3000):
        for item in reservoir(map(str, range(10)), 3, random.Random(seed)):
            counts[int(item)] += 1
    assert all(800 < c < 1000 for c in counts), counts
    assert reservoir(["x", "y"], 5, random.Random(0)) == ["x", "y"]


def test_a_bad_data_set_is_one_clear_error(tmp_path, corpus):
    with pytest.raises(DocumentError, match="has no column 'body'.*text, question"):
        load_documents(f"{corpus}#body")
    with pytest.raises(ConfigError, match="params.document_source.*no column 'body'"):
        check_document_source(f"{corpus}#body", "params.document_source")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not a parquet file")
    with pytest.raises(DocumentError, match="cannot be read as a data set"):
        load_documents(str(broken))
    check_document_source(str(corpus), "params.document_source")  # reads the first row only


def test_a_grounded_recipe_reads_a_parquet_corpus(tmp_path, random_model_dir):
    sheets = tmp_path / "sheets.parquet"
    pq.write_table(pa.table({"text": ["a=3,b=7", "a=1,b=2,c=5"]}), sheets)
    for recipe, key in (("spice", "document_source"), ("infuser", "document_source")):
        made = helpers.make_recipe(recipe, random_model_dir, f"params.{key}={sheets}", "params.document_min_tokens=1",
                                   preset="small")
        assert sorted(made.documents.passages) == ["a=1,b=2,c=5", "a=3,b=7"], recipe
