"""Unit tests of hostd/domain/guest_profiles.py against the real profiles in guestimages/profiles/
(and small hand-written TOML documents for the refusal cases)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from hostd.apply.images import ImageStore
from hostd.domain.guest_profiles import (
    GuestProfileError,
    ImageCaps,
    UnknownProfile,
    cmdline_for_vm,
    guest_env,
    image_store_args,
    irq_vcpus_for,
    kernel_params,
    load_profiles,
    parse_profile,
    render_cmdline,
    render_env_file,
    write_guest_env_files,
)

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "guestimages/profiles"
BASE = "root=/dev/vda ro console=ttyS0 panic=-1"
MANIFEST = {"name": "online", "kind": "disk", "cmdline": BASE, "profiles": ["baseline", "online", "online-nodecay"],
            "capabilities": {"nohlt_list": False, "haltpoll": True, "haltpoll_governor": False}}


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(PROFILES)


def _minimal(**sections) -> dict:
    d = {"name": "p", "description": "d"}
    d.update(sections)
    return d


def _setting(**kw) -> dict:
    return {"why": "because", "exit_signature": "HLT exits", **kw}


# -- the shipped profiles ------------------------------------------------------

def test_shipped_profiles_load_and_every_setting_says_why_and_its_exit_signature(profiles):
    assert set(profiles) == {"baseline", "online", "online-nodecay"}
    assert profiles["baseline"].settings() == {}
    for name in ("online", "online-nodecay"):
        s = profiles[name].settings()
        assert set(s) == {"clock", "irq", "idle", "atop", "malloc", "innodb"}
        for key, setting in s.items():
            assert len(setting.why) > 40, (name, key)
            assert len(setting.exit_signature) > 20, (name, key)
    # the exit signatures name the real addresses kvm-utils shows
    online = profiles["online"]
    assert "0x608" in online.clock.exit_signature and "0xb008" in online.clock.exit_signature
    assert "0x38f" in online.atop.exit_signature
    assert "0x830" in online.malloc.exit_signature and "0x830" in online.idle.exit_signature
    assert "HLT" in online.idle.exit_signature
    assert online.malloc.tradeoff and profiles["online-nodecay"].malloc.tradeoff
    assert profiles["online-nodecay"].malloc.conf == "dirty_decay_ms:-1,muzzy_decay_ms:-1"
    assert online.atop.perfevents == "disable"
    assert online.innodb.doublewrite == "auto" and "virtio" in online.innodb.tradeoff


# -- cmdline rendering ---------------------------------------------------------

def test_online_on_debian_kernel_uses_haltpoll_driver_without_governor_tunables(profiles):
    line = render_cmdline(BASE, profiles["online"], vcpus=4, caps=ImageCaps.from_manifest(MANIFEST))
    assert line.split() == [*BASE.split(), "hyb.profile=online", "hyb.irq_cpus=0", "clocksource=tsc",
                            "tsc=reliable", "irqaffinity=0", "cpuidle_haltpoll.force=1"]


def test_online_with_haltpoll_governor_gets_its_tunables(profiles):
    params = kernel_params(profiles["online"], vcpus=2, caps=ImageCaps(haltpoll_governor=True))
    assert "cpuidle_haltpoll.force=1" in params
    assert "haltpoll.guest_halt_poll_ns=200000" in params
    assert "haltpoll.guest_halt_poll_allow_shrink=Y" in params
    assert not any(p.startswith("nohlt_list") for p in params)


def test_nohlt_list_kernel_polls_only_on_the_irq_vcpus(profiles):
    params = kernel_params(profiles["online"], vcpus=8, irq_vcpus=2, caps=ImageCaps(nohlt_list=True))
    assert "nohlt_list=0-1" in params and "irqaffinity=0-1" in params and "hyb.irq_cpus=0-1" in params
    assert not any("haltpoll" in p for p in params)


def test_irq_vcpus_as_cpulist_and_as_iterable(profiles):
    p = profiles["online"]
    assert "irqaffinity=0,6-7" in kernel_params(p, vcpus=8, irq_vcpus="0,6-7")
    assert "irqaffinity=1,3" in kernel_params(p, vcpus=4, irq_vcpus=[3, 1])


def test_baseline_adds_only_the_profile_markers(profiles):
    assert kernel_params(profiles["baseline"], vcpus=2) == ["hyb.profile=baseline", "hyb.irq_cpus=0"]


def test_owned_parameters_in_the_base_are_replaced_not_duplicated(profiles):
    base = "root=/dev/vda clocksource=hpet irqaffinity=1 haltpoll.guest_halt_poll_ns=5 hyb.profile=x quiet"
    words = render_cmdline(base, profiles["online"], vcpus=2).split()
    assert words.count("clocksource=tsc") == 1 and "clocksource=hpet" not in words
    assert "irqaffinity=1" not in words and "hyb.profile=x" not in words
    assert "haltpoll.guest_halt_poll_ns=5" not in words
    assert words[:2] == ["root=/dev/vda", "quiet"]


def test_no_profile_leaves_the_base_alone_but_still_checks_the_layout():
    assert render_cmdline("a  b", None, vcpus=2) == "a b"
    with pytest.raises(GuestProfileError) as e:
        render_cmdline("a", None, vcpus=2, irq_vcpus="5")
    assert e.value.field == "irq_vcpus"


def test_idle_polling_on_an_image_without_either_mechanism_is_refused(profiles):
    with pytest.raises(GuestProfileError) as e:
        kernel_params(profiles["online"], vcpus=2, caps=ImageCaps(nohlt_list=False, haltpoll=False))
    assert e.value.field == "profile.online.idle"


@pytest.mark.parametrize("irq, why", [
    (0, "count 0"), (3, "count 3"), ("2", "out of range"), ("0-5", "out of range"),
    ("x", "not a CPU number"), ("", "at least one"), ([0, -1], "out of range"), (True, "count"),
])
def test_irq_vcpus_errors_name_the_field(irq, why):
    with pytest.raises(GuestProfileError) as e:
        irq_vcpus_for(2, irq)
    assert e.value.field == "irq_vcpus" and why in e.value.detail


def test_vcpus_must_be_positive():
    with pytest.raises(GuestProfileError) as e:
        irq_vcpus_for(0)
    assert e.value.field == "vcpus"


def test_cmdline_for_vm_from_the_manifest(profiles):
    line = cmdline_for_vm(profiles, MANIFEST, "online-nodecay", vcpus=4, irq_vcpus=2)
    assert "hyb.profile=online-nodecay" in line and "irqaffinity=0-1" in line
    assert cmdline_for_vm(profiles, MANIFEST, "", vcpus=1) == BASE
    with pytest.raises(UnknownProfile) as e:
        cmdline_for_vm(profiles, MANIFEST, "gaming", vcpus=2)
    assert e.value.field == "profile" and "online-nodecay" in e.value.detail
    with pytest.raises(UnknownProfile) as e:  # known to hostd, not built into this image
        cmdline_for_vm(profiles, {**MANIFEST, "profiles": ["baseline"]}, "online", vcpus=2)
    assert "built with profiles" in e.value.detail
    with pytest.raises(GuestProfileError) as e:
        cmdline_for_vm(profiles, {**MANIFEST, "capabilities": {"nohlt_list": "yes"}}, "online", vcpus=2)
    assert e.value.field == "manifest.capabilities.nohlt_list"


# -- loading refusals ----------------------------------------------------------

@pytest.mark.parametrize("doc, field", [
    ({"description": "x"}, "t.name"),
    ({"name": "Bad Name"}, "t.name"),
    (_minimal(colour="red"), "t.colour"),
    (_minimal(clock={"cmdline": ["clocksource=tsc"], "why": "w"}), "t.clock.exit_signature"),
    (_minimal(clock=_setting(cmdline=["a b"])), "t.clock.cmdline[0]"),
    (_minimal(clock=_setting(cmdline="clocksource=tsc")), "t.clock.cmdline"),
    (_minimal(clock=_setting(why="  ", cmdline=[])), "t.clock.why"),
    (_minimal(idle=_setting(poll="always")), "t.idle.poll"),
    (_minimal(idle=_setting(haltpoll={"guest_halt_poll_nsec": 1})), "t.idle.haltpoll.guest_halt_poll_nsec"),
    (_minimal(idle=_setting(haltpoll={"guest_halt_poll_ns": -1})), "t.idle.haltpoll.guest_halt_poll_ns"),
    (_minimal(idle=_setting(haltpoll={"guest_halt_poll_ns": True})), "t.idle.haltpoll.guest_halt_poll_ns"),
    (_minimal(atop=_setting(perfevents="off")), "t.atop.perfevents"),
    (_minimal(malloc=_setting(conf="a b", tradeoff="t")), "t.malloc.conf"),
    (_minimal(malloc=_setting(conf="x:1")), "t.malloc.tradeoff"),
    (_minimal(irq=_setting(irqaffinity="yes")), "t.irq.irqaffinity"),
    (_minimal(irq=_setting(extra=1)), "t.irq.extra"),
    (_minimal(irq=[1]), "t.irq"),
    (_minimal(innodb=_setting(doublewrite="off")), "t.innodb.doublewrite"),  # off is the guest's call
    (_minimal(innodb=_setting()), "t.innodb.doublewrite"),
])
def test_bad_profiles_name_the_field(doc, field):
    with pytest.raises(GuestProfileError) as e:
        parse_profile(doc, "t")
    assert e.value.field == field, e.value


def test_load_refuses_bad_toml_and_a_name_that_is_not_the_file_name(tmp_path):
    (tmp_path / "a.toml").write_text('name = "b"\n')
    with pytest.raises(GuestProfileError) as e:
        load_profiles(tmp_path)
    assert e.value.field == "a.toml.name"
    (tmp_path / "a.toml").write_text('name = "a"\n[clock\n')
    with pytest.raises(GuestProfileError) as e:
        load_profiles(tmp_path)
    assert e.value.field == "a.toml"
    (tmp_path / "a.toml").unlink()
    with pytest.raises(GuestProfileError) as e:
        load_profiles(tmp_path)
    assert e.value.field == "profiles"


# -- guest side ----------------------------------------------------------------

def test_env_files_are_what_the_guest_script_sources(profiles, tmp_path):
    names = write_guest_env_files(PROFILES, tmp_path)
    assert names == ["baseline", "online", "online-nodecay"]
    for name in names:
        # source the file with a real POSIX shell, as hyb-profile-apply does
        out = subprocess.run(["sh", "-c", f"set -a; . {shlex.quote(str(tmp_path / (name + '.env')))}; "
                              "env | grep ^HYB_ | sort"], capture_output=True, text=True, check=True,
                             env={"PATH": os.environ["PATH"]}).stdout  # only what the file sets
        assert dict(line.split("=", 1) for line in out.splitlines()) == guest_env(profiles[name])
    assert guest_env(profiles["online"])["HYB_MALLOC_CONF"] == "dirty_decay_ms:60000,muzzy_decay_ms:60000"
    assert guest_env(profiles["baseline"]) == {"HYB_PROFILE": "baseline", "HYB_IRQ_VIRTIO_AFFINITY": "0",
                                               "HYB_IDLE_POLL": "none", "HYB_ATOP_PERFEVENTS": "",
                                               "HYB_MALLOC_CONF": "", "HYB_INNODB_DOUBLEWRITE": ""}
    assert guest_env(profiles["online"])["HYB_INNODB_DOUBLEWRITE"] == "auto"
    assert render_env_file(profiles["online"]).startswith("# online: ")


def test_image_store_registers_a_built_image(tmp_path):
    d = tmp_path / "img"
    d.mkdir()
    for f in ("online.raw", "vmlinuz", "initrd.img"):
        (d / f).write_bytes(f.encode())
    manifest = {**MANIFEST, "version": "v1",
                "files": {"disk": "online.raw", "kernel": "vmlinuz", "initrd": "initrd.img"}}
    store = ImageStore(tmp_path / "store")
    img = store.add(**image_store_args(manifest, d))
    assert img.kind == "disk" and img.profiles == ("baseline", "online", "online-nodecay")
    assert store.get("online").files["disk"] == str(d / "online.raw")
    with pytest.raises(GuestProfileError) as e:
        image_store_args({**manifest, "files": {"disk": "online.raw"}}, d)
    assert e.value.field == "manifest.files.kernel"
