"""``saria lmcache check``: docs/lmcache.md's LMCache configurations pass, and
each mistake LMCache's in-engine loader would only log (or trip on) is one
line naming the key, exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from saria.cli.main import main

README = (Path(__file__).resolve().parents[1] / "docs" / "lmcache.md").read_text()  # the LMCache page


def readme_yaml(tmp_path) -> str:
    yaml = README.split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.replace("/mnt/nvme0/kv", str(tmp_path / "kv"))


def readme_json(tmp_path) -> str:
    d = json.loads(re.search(r"--l2-adapter '(\{.*?\})'", README).group(1))
    d["adapter_params"]["path"] = [str(tmp_path / p.split("/")[2]) for p in d["adapter_params"]["path"]]
    return json.dumps(d)


def check(tmp_path, capsys, yaml: str | None = None, l2: str | None = None):
    if yaml is not None:
        (tmp_path / "c.yaml").write_text(yaml)
        rc = main(["lmcache", "check", str(tmp_path / "c.yaml")])
    else:
        rc = main(["lmcache", "check", "--l2-adapter", l2])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_readme_configs_pass(tmp_path, capsys):
    pytest.importorskip("yaml", reason="YAML needs PyYAML (the [lmcache] extra)")
    rc, out, _ = check(tmp_path, capsys, yaml=readme_yaml(tmp_path))
    assert rc == 0 and out.startswith("ok: storage plugin 'saria': admission saria") and "2 TB" in out
    rc, out, _ = check(tmp_path, capsys, l2=readme_json(tmp_path))
    assert rc == 0 and "admission budget" in out and "2 drive(s)" in out


@pytest.mark.parametrize("edit, message", [
    (("storage_plugins: [saria]", "storage_plugins: [other]"), "storage_plugins: does not list 'saria'"),
    (("capacity: 2TB", "capacity: lots"), "capacity: cannot parse 'lots'"),
    (("admission: saria", "admission: sometimes"), "admission: unknown admission policy"),
    (("module_path: saria.lmcache", "module_path: saria.lmcach"),
     "storage_plugin.saria.module_path: is 'saria.lmcach'"),
    (("storage_plugin.saria.capacity", "storage_plugin.saria.capacty"), "capacty: unknown key"),
    (("extra_config:\n", "extra_config:\n  storage_plugin:\n    saria: {path: /x}\n"),
     "extra_config.storage_plugin: LMCache reads only flat keys"),
])
def test_a_mistake_is_one_line_naming_the_key(tmp_path, capsys, edit, message):
    pytest.importorskip("yaml", reason="YAML needs PyYAML (the [lmcache] extra)")
    yaml = readme_yaml(tmp_path)
    assert edit[0] in yaml
    rc, out, err = check(tmp_path, capsys, yaml=yaml.replace(edit[0], edit[1], 1))
    assert rc == 2 and not out
    assert err.startswith(f"saria: error: {message}") and err.count("\n") == 1, err


def test_bad_yaml_and_json_name_where(tmp_path, capsys):
    pytest.importorskip("yaml", reason="YAML needs PyYAML (the [lmcache] extra)")
    rc, _, err = check(tmp_path, capsys, yaml="a: [1\n")
    assert rc == 2 and "c.yaml:2: not YAML" in err
    rc, _, err = check(tmp_path, capsys, l2='{"type": "fs"}')
    assert rc == 2 and err.startswith("saria: error: --l2-adapter: saria's adapter is")
    bad = json.loads(readme_json(tmp_path))
    bad["adapter_params"]["dwpd"] = -1
    rc, _, err = check(tmp_path, capsys, l2=json.dumps(bad))
    assert rc == 2 and err.startswith("saria: error: dwpd: must be a positive number")
