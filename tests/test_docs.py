"""The docs: the site builds with --strict (a broken link fails), the README
stays a front door whose links resolve, every connector key is documented,
and the deploy files parse and use only real keys."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from saria.connector.config import KEYS, key_docs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f",
                        str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                       capture_output=True, text=True, timeout=300,
                       env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr
    engine = (tmp_path / "site" / "engine" / "index.html").read_text()
    for key in KEYS:  # the generated table
        assert f"<code>{key}</code>" in engine, key


def test_every_connector_key_has_its_documentation():
    docs = key_docs()
    assert list(docs) == list(KEYS) or set(docs) == set(KEYS)
    assert all(text.strip() for text in docs.values())


def test_the_readme_is_a_front_door_whose_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert "arXiv:2610.31169" in text  # the paper, cited
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_serve_toml_uses_only_saria_serve_keys():
    from saria.cli import serve_config
    from saria.cli.main import build_parser

    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    files = [tomllib.loads((ROOT / "deploy" / "serve.toml").read_text())]
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "saria-daemonset.yaml").read_text()))
    assert {d["kind"] for d in docs} == {"ConfigMap", "DaemonSet"}
    files.append(tomllib.loads(docs[0]["data"]["serve.toml"]))
    for conf in files:
        args = serve_config.parse(serve, [], conf, source="deploy")
        assert args.ssd_dir and args.ssd_bytes and args.listen.startswith("ipc://")
    container = docs[1]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["serve", "--config", "/etc/saria/serve.toml"]


def test_systemd_unit_docker_and_grafana_parse():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "deploy" / "systemd" / "saria-serve.service")
    assert "saria serve --config /etc/saria/serve.toml" in unit["Service"]["ExecStart"]
    assert unit["Service"]["RestartPreventExitStatus"] == "2"  # a bad setting is not retried
    docker = (ROOT / "Dockerfile").read_text()
    assert docker.startswith("#") and re.search(r"(?m)^FROM ", docker) and "ENTRYPOINT" in docker
    dash = json.loads((ROOT / "deploy" / "grafana" / "saria-serve.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs and all("saria_serve_" in e for e in exprs)
