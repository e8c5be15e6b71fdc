"""Guest tuning profiles (guestimages/profiles/*.toml) and the kernel cmdline a VM boots with.

A profile is a set of *settings*, each a TOML table with the values, a ``why`` and the
``exit_signature`` that ``kvm-utils`` shows when the setting is missing:

    [clock]   cmdline = ["clocksource=tsc", "tsc=reliable"]
    [irq]     irqaffinity = true, virtio_affinity = true
    [idle]    poll = "irq-vcpus" | "none", [idle.haltpoll] guest_halt_poll_ns = ...
    [atop]    perfevents = "disable" | "enable" | "auto"
    [malloc]  conf = "<jemalloc MALLOC_CONF>", tradeoff = "..."
    [innodb]  doublewrite = "auto" | "on"   (auto: OFF only on a datadir disk whose atomic
              write unit covers an InnoDB page; the rule is guestimages/common/hyb-innodb-atomic)

A missing table means "as Debian ships it". Kernel-side settings become cmdline
parameters rendered here from the VM's real vCPU layout and the image's capabilities
(``nohlt_list`` needs the kernel-patches/ guest kernel; otherwise ``cpuidle-haltpoll``);
guest-side settings are baked into the image as ``/etc/hyb/profiles/<name>.env`` and
applied at boot by ``hyb-profile-apply``, which finds the profile and the IRQ vCPUs in
``hyb.profile=`` and ``hyb.irq_cpus=``. Pure: no IO except the explicit load/write helpers.
"""

from __future__ import annotations

import shlex
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostd.cpulist import CpuListError, format_cpu_list, parse_cpu_list
from hostd.errors import GuestProfileError, UnknownProfile

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_")
HALTPOLL_PARAMS = {  # haltpoll governor module parameters (drivers/cpuidle/governors/haltpoll.c)
    "guest_halt_poll_ns": int, "guest_halt_poll_grow": int, "guest_halt_poll_grow_start": int,
    "guest_halt_poll_shrink": int, "guest_halt_poll_allow_shrink": bool,
}
ATOP_PERFEVENTS = ("disable", "enable", "auto")
IDLE_POLL = ("irq-vcpus", "none")
INNODB_DOUBLEWRITE = ("auto", "on")
_SECTIONS = ("clock", "irq", "idle", "atop", "malloc", "innodb")
# Cmdline keys a profile owns: removed from the image's base cmdline before rendering,
# so a profile never ends up with two contradicting values.
_OWNED_KEYS = ("clocksource", "tsc", "irqaffinity", "nohlt_list", "cpuidle_haltpoll.",
               "haltpoll.", "hyb.profile", "hyb.irq_cpus", "idle")


@dataclass(frozen=True)
class Setting:
    why: str
    exit_signature: str


@dataclass(frozen=True)
class ClockSetting(Setting):
    cmdline: tuple[str, ...] = ()


@dataclass(frozen=True)
class IrqSetting(Setting):
    irqaffinity: bool = True
    virtio_affinity: bool = True


@dataclass(frozen=True)
class IdleSetting(Setting):
    poll: str = "irq-vcpus"
    haltpoll: Mapping[str, int | bool] = field(default_factory=dict)


@dataclass(frozen=True)
class AtopSetting(Setting):
    perfevents: str = "disable"


@dataclass(frozen=True)
class MallocSetting(Setting):
    conf: str = ""
    tradeoff: str = ""


@dataclass(frozen=True)
class InnodbSetting(Setting):
    doublewrite: str = "auto"
    tradeoff: str = ""


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    clock: ClockSetting | None = None
    irq: IrqSetting | None = None
    idle: IdleSetting | None = None
    atop: AtopSetting | None = None
    malloc: MallocSetting | None = None
    innodb: InnodbSetting | None = None

    def settings(self) -> dict[str, Setting]:
        return {k: v for k in _SECTIONS
                if (v := getattr(self, k)) is not None}


@dataclass(frozen=True)
class ImageCaps:
    """What the image's guest kernel can do (its manifest's ``capabilities``)."""

    nohlt_list: bool = False  # the kernel-patches/ nohlt_list= series
    haltpoll: bool = True  # the cpuidle-haltpoll driver (CONFIG_HALTPOLL_CPUIDLE)
    haltpoll_governor: bool = False  # its governor + tunables (CONFIG_CPU_IDLE_GOV_HALTPOLL)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> "ImageCaps":
        caps = manifest.get("capabilities") or {}
        if not isinstance(caps, Mapping):
            raise GuestProfileError("must be a table of booleans", field="manifest.capabilities")
        for k, v in caps.items():
            if not isinstance(v, bool):
                raise GuestProfileError("must be true or false", field=f"manifest.capabilities.{k}")
        return cls(nohlt_list=caps.get("nohlt_list", False), haltpoll=caps.get("haltpoll", True),
                   haltpoll_governor=caps.get("haltpoll_governor", False))


# -- loading -------------------------------------------------------------------

def _take(table: dict[str, Any], key: str, kind: type, where: str, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise GuestProfileError("is required", field=f"{where}.{key}")
        return default
    v = table.pop(key)
    if kind is int and isinstance(v, bool) or not isinstance(v, kind):
        raise GuestProfileError(f"must be a {kind.__name__}, not {type(v).__name__}", field=f"{where}.{key}")
    return v


def _no_extra(table: dict[str, Any], where: str) -> None:
    if table:
        raise GuestProfileError(f"unknown key(s) {sorted(table)}", field=f"{where}.{sorted(table)[0]}")


def _setting(table: dict[str, Any], where: str) -> dict[str, str]:
    out = {}
    for k in ("why", "exit_signature"):
        v = _take(table, k, str, where).strip()
        if not v:
            raise GuestProfileError("must not be empty", field=f"{where}.{k}")
        out[k] = " ".join(v.split())
    return out


def parse_profile(data: Mapping[str, Any], where: str = "profile") -> Profile:
    """A Profile from a parsed TOML document; errors name ``<where>.<key>``."""
    d = dict(data)
    name = _take(d, "name", str, where)
    if not name or not set(name) <= _NAME_CHARS:
        raise GuestProfileError("use a-z, 0-9, '-', '_'", field=f"{where}.name")
    desc = _take(d, "description", str, where, "")
    kw: dict[str, Any] = {}
    for section in _SECTIONS:
        if section not in d:
            continue
        t = d.pop(section)
        w = f"{where}.{section}"
        if not isinstance(t, dict):
            raise GuestProfileError("must be a table", field=w)
        t = dict(t)
        base = _setting(t, w)
        if section == "clock":
            cmd = _take(t, "cmdline", list, w)
            for i, p in enumerate(cmd):
                if not isinstance(p, str) or not p or any(c.isspace() for c in p):
                    raise GuestProfileError("must be one parameter without spaces", field=f"{w}.cmdline[{i}]")
            kw[section] = ClockSetting(**base, cmdline=tuple(cmd))
        elif section == "irq":
            kw[section] = IrqSetting(**base, irqaffinity=_take(t, "irqaffinity", bool, w, True),
                                     virtio_affinity=_take(t, "virtio_affinity", bool, w, True))
        elif section == "idle":
            poll = _take(t, "poll", str, w, "irq-vcpus")
            if poll not in IDLE_POLL:
                raise GuestProfileError(f"must be one of {list(IDLE_POLL)}", field=f"{w}.poll")
            hp = dict(_take(t, "haltpoll", dict, w, {}))
            params: dict[str, int | bool] = {}
            for k in list(hp):
                if k not in HALTPOLL_PARAMS:
                    raise GuestProfileError(f"unknown haltpoll parameter (known: {sorted(HALTPOLL_PARAMS)})",
                                            field=f"{w}.haltpoll.{k}")
                v = _take(hp, k, HALTPOLL_PARAMS[k], f"{w}.haltpoll")
                if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                    raise GuestProfileError("must be >= 0", field=f"{w}.haltpoll.{k}")
                params[k] = v
            kw[section] = IdleSetting(**base, poll=poll, haltpoll=params)
        elif section == "atop":
            pe = _take(t, "perfevents", str, w)
            if pe not in ATOP_PERFEVENTS:
                raise GuestProfileError(f"must be one of {list(ATOP_PERFEVENTS)}", field=f"{w}.perfevents")
            kw[section] = AtopSetting(**base, perfevents=pe)
        elif section == "innodb":
            dw = _take(t, "doublewrite", str, w)
            if dw not in INNODB_DOUBLEWRITE:
                raise GuestProfileError(f"must be one of {list(INNODB_DOUBLEWRITE)} (off is decided in the guest, "
                                        "from the data disk's atomic write unit, never set)", field=f"{w}.doublewrite")
            kw[section] = InnodbSetting(**base, doublewrite=dw,
                                        tradeoff=" ".join(_take(t, "tradeoff", str, w, "").split()))
        else:
            conf = _take(t, "conf", str, w)
            if not conf or any(c.isspace() or c in "'\"\\$`" for c in conf):
                raise GuestProfileError("must be a non-empty MALLOC_CONF without spaces or quotes",
                                        field=f"{w}.conf")
            kw[section] = MallocSetting(**base, conf=conf, tradeoff=" ".join(_take(t, "tradeoff", str, w).split()))
        _no_extra(t, w)
    _no_extra(d, where)
    return Profile(name=name, description=desc, **kw)


def load_profiles(directory: Path) -> dict[str, Profile]:
    """Every ``*.toml`` in ``directory``, by name; the file stem must be the name."""
    out: dict[str, Profile] = {}
    for path in sorted(Path(directory).glob("*.toml")):
        where = path.name
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise GuestProfileError(f"not valid TOML: {e}", field=where) from None
        prof = parse_profile(data, where)
        if prof.name != path.stem:
            raise GuestProfileError(f"name {prof.name!r} differs from the file name", field=f"{where}.name")
        out[prof.name] = prof
    if not out:
        raise GuestProfileError(f"no *.toml profiles in {directory}", field="profiles")
    return out


# -- rendering -----------------------------------------------------------------

def irq_vcpus_for(vcpus: int, irq_vcpus: int | str | Iterable[int] | None = None) -> frozenset[int]:
    """The vCPUs that take device interrupts: None -> vCPU 0; an int n -> the first n
    vCPUs; a cpulist string or an iterable -> those vCPUs, each one of the VM's."""
    if vcpus < 1:
        raise GuestProfileError(f"must be >= 1, got {vcpus}", field="vcpus")
    if irq_vcpus is None:
        cpus = frozenset({0})
    elif isinstance(irq_vcpus, bool):
        raise GuestProfileError("must be a count, a CPU list or a list of vCPUs", field="irq_vcpus")
    elif isinstance(irq_vcpus, int):
        if not 1 <= irq_vcpus <= vcpus:
            raise GuestProfileError(f"count {irq_vcpus} is not within 1..{vcpus} (the VM's vCPUs)",
                                    field="irq_vcpus")
        cpus = frozenset(range(irq_vcpus))
    elif isinstance(irq_vcpus, str):
        try:
            cpus = parse_cpu_list(irq_vcpus)
        except CpuListError as e:
            raise GuestProfileError(str(e), field="irq_vcpus") from None
    else:
        cpus = frozenset(irq_vcpus)
    if not cpus:
        raise GuestProfileError("must name at least one vCPU", field="irq_vcpus")
    bad = sorted(c for c in cpus if not 0 <= c < vcpus)
    if bad:
        raise GuestProfileError(f"vCPU(s) {', '.join(map(str, bad))} out of range "
                                f"0-{vcpus - 1} (the VM has {vcpus} vCPUs)", field="irq_vcpus")
    return cpus


def _owned(param: str) -> bool:
    key = param.split("=", 1)[0]
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in _OWNED_KEYS)


def _fmt(v: int | bool) -> str:
    return ("Y" if v else "N") if isinstance(v, bool) else str(v)


def kernel_params(profile: Profile, *, vcpus: int, irq_vcpus: int | str | Iterable[int] | None = None,
                  caps: ImageCaps = ImageCaps()) -> list[str]:
    """The cmdline parameters of ``profile`` for this VM (without the image's base)."""
    irq = format_cpu_list(irq_vcpus_for(vcpus, irq_vcpus))
    params = [f"hyb.profile={profile.name}", f"hyb.irq_cpus={irq}"]
    if profile.clock:
        params += profile.clock.cmdline
    if profile.irq and profile.irq.irqaffinity:
        params.append(f"irqaffinity={irq}")
    if profile.idle and profile.idle.poll == "irq-vcpus":
        if caps.nohlt_list:
            params.append(f"nohlt_list={irq}")
        elif caps.haltpoll:
            # Upstream fallback: the cpuidle-haltpoll driver (force=1: also without
            # the KVM_HINTS_REALTIME hint), and its governor's tunables where the
            # kernel has that governor (Debian's 6.1 kernels do not: the tunables
            # are dropped there, the driver then runs under the menu governor).
            params.append("cpuidle_haltpoll.force=1")
            if caps.haltpoll_governor:
                params += [f"haltpoll.{k}={_fmt(v)}" for k, v in sorted(profile.idle.haltpoll.items())]
        else:
            raise GuestProfileError("the image's kernel supports neither nohlt_list nor cpuidle-haltpoll",
                                    field=f"profile.{profile.name}.idle")
    return params


def render_cmdline(base: str, profile: Profile | None, *, vcpus: int,
                   irq_vcpus: int | str | Iterable[int] | None = None, caps: ImageCaps = ImageCaps()) -> str:
    """The image's base cmdline with the profile's parameters; parameters the profile
    owns are dropped from the base first. No profile: the base as it is."""
    if profile is None:
        irq_vcpus_for(vcpus, irq_vcpus)  # still validate the layout
        return " ".join(base.split())
    kept = [p for p in base.split() if not _owned(p)]
    return " ".join(kept + kernel_params(profile, vcpus=vcpus, irq_vcpus=irq_vcpus, caps=caps))


def cmdline_for_vm(profiles: Mapping[str, Profile], manifest: Mapping[str, Any], profile: str, *,
                   vcpus: int, irq_vcpus: int | str | Iterable[int] | None = None) -> str:
    """What hostd passes as <cmdline>: image manifest + profile name + the VM's vCPU layout."""
    if profile and profile not in profiles:
        raise UnknownProfile(f"no profile {profile!r} (known: {', '.join(sorted(profiles))})", field="profile")
    offered = manifest.get("profiles")
    if profile and offered is not None and profile not in offered:
        raise UnknownProfile(f"image {manifest.get('name')!r} was built with profiles {list(offered)}",
                             field="profile")
    return render_cmdline(str(manifest.get("cmdline", "")), profiles[profile] if profile else None,
                          vcpus=vcpus, irq_vcpus=irq_vcpus, caps=ImageCaps.from_manifest(manifest))


# -- in-guest side -------------------------------------------------------------

def guest_env(profile: Profile) -> dict[str, str]:
    """The variables hyb-profile-apply reads from /etc/hyb/profiles/<name>.env."""
    return {
        "HYB_PROFILE": profile.name,
        "HYB_IRQ_VIRTIO_AFFINITY": "1" if profile.irq and profile.irq.virtio_affinity else "0",
        "HYB_IDLE_POLL": profile.idle.poll if profile.idle else "none",
        "HYB_ATOP_PERFEVENTS": profile.atop.perfevents if profile.atop else "",
        "HYB_MALLOC_CONF": profile.malloc.conf if profile.malloc else "",
        "HYB_INNODB_DOUBLEWRITE": profile.innodb.doublewrite if profile.innodb else "",
    }


def render_env_file(profile: Profile) -> str:
    lines = [f"# {profile.name}: {profile.description}".rstrip(),
             "# Generated from guestimages/profiles/ by hostd/domain/guest_profiles.py; do not edit."]
    lines += [f"{k}={shlex.quote(v)}" for k, v in guest_env(profile).items()]
    return "\n".join(lines) + "\n"


def write_guest_env_files(profiles_dir: str | Path, dest: str | Path) -> list[str]:
    """Render every profile into ``dest/<name>.env`` (used by the image build); returns the names."""
    profiles = load_profiles(Path(profiles_dir))
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    for name, prof in profiles.items():
        (out / f"{name}.env").write_text(render_env_file(prof))
    return sorted(profiles)


def image_store_args(manifest: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """Keyword arguments for ``ImageStore.add`` for a built guest image (its manifest.json
    and the directory that holds the files)."""
    files = manifest.get("files")
    if not isinstance(files, Mapping):
        raise GuestProfileError("missing", field="manifest.files")
    roles = {"disk": ("disk", "kernel", "initrd"), "kernel": ("kernel", "initrd")}.get(manifest.get("kind", ""))
    if roles is None:
        raise GuestProfileError("must be disk or kernel", field="manifest.kind")
    missing = [r for r in roles if r not in files]
    if missing:
        raise GuestProfileError(f"no {missing[0]} file", field=f"manifest.files.{missing[0]}")
    return {"name": manifest["name"], "version": str(manifest.get("version", "")), "kind": manifest["kind"],
            "files": {r: Path(directory) / files[r] for r in roles},
            "cmdline": str(manifest.get("cmdline", "")), "fmt": "raw",
            "profiles": tuple(manifest.get("profiles", ())),
            "capabilities": {k: v for k, v in (manifest.get("capabilities") or {}).items() if isinstance(v, bool)}}
