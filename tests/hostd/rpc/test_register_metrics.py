"""What hostd registers for Prometheus (hostd/rpc/register.py): the metrics URL it derives
from metrics_listen, or the one configured (checked at load, naming the key)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hostd.config import load_config
from hostd.errors import ConfigError
from hostd.rpc.register import metrics_url


@pytest.mark.parametrize("listen, advertise, url", [
    ("127.0.0.1:9743", "oss-1", "http://127.0.0.1:9743/metrics"),   # a concrete address: itself
    ("10.1.2.3:9100", "oss-1", "http://10.1.2.3:9100/metrics"),
    ("0.0.0.0:9743", "oss-1.example", "http://oss-1.example:9743/metrics"),  # every address: the advertised host
    ("[::]:9743", "fd00::17", "http://[fd00::17]:9743/metrics"),
    (":9743", "10.0.0.5", "http://10.0.0.5:9743/metrics"),
    ("[fd00::5]:9743", "oss-1", "http://[fd00::5]:9743/metrics"),
    ("", "oss-1", ""),  # metrics off: nothing to scrape, nothing registered
])
def test_metrics_url_from_listen_address(listen: str, advertise: str, url: str) -> None:
    assert metrics_url(metrics_listen=listen, advertise_host=advertise) == url


@pytest.mark.parametrize("bad", ["ftp://h:1/metrics", "h:9743", "http://h/metrics", "http://h:1/m?x=1",
                                 "http://h:99999/metrics"])
def test_a_bad_configured_metrics_url_is_refused_at_load(tmp_path: Path, bad: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("HOSTD_")]:
        monkeypatch.delenv(k)
    cfg = tmp_path / "hostd.toml"
    cfg.write_text(f'metrics_url = "{bad}"\n')
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert e.value.field == "metrics_url"
    cfg.write_text('metrics_url = "https://oss-1.example:9443/hostd/metrics"\n')
    assert load_config(cfg).metrics_url == "https://oss-1.example:9443/hostd/metrics"
