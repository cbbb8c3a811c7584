"""ZooKeeper's server jars and a `java` to run them, resolved once and cached.

The jars come from Maven Central through the pom shipped in this package (`zookeeper/pom.xml`):
`mvn dependency:build-classpath` resolves them into ~/.m2 on first use, and the classpath it prints is cached in a
file keyed by the pom's hash (under $ONCELOG_ZOOKEEPER_CACHE, default ~/.cache/oncelog/zookeeper-<version>), so
later starts run no Maven at all and need no network. Java and Maven are needed by cluster mode only: the single
node never imports this module.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from xml.etree import ElementTree

POM = Path(__file__).parent / "zookeeper" / "pom.xml"
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
RESOLVE_TIMEOUT_S = 280.0       # first resolution (~30 jars, 10 MB); under pytest-timeout's 300 s
JAVA_VERSION_TIMEOUT_S = 60.0
MIN_JAVA = 8                    # ZooKeeper 3.9's classes are Java 8 bytecode

_OFFLINE = re.compile(
    r"Could not transfer|Unknown ?host|Network is unreachable|Connection refused|Connect(ion)? timed out|"
    r"Read timed out|No route to host|Temporary failure in name resolution|offline mode|"
    r"has not been downloaded from it before|Cannot access central|PKIX path",
    re.IGNORECASE,
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class CoordinationUnavailable(Exception):
    """ZooKeeper cannot run here: no `java` or `mvn`, Java too old, or Maven Central unreachable the first time.

    A reason to skip a test, and an error the CLI reports in one line."""


def zookeeper_version() -> str:
    """The ZooKeeper version the pom pins (its `zookeeper.version` property)."""
    version = ElementTree.parse(POM).getroot().findtext("m:properties/m:zookeeper.version", namespaces=_NS)
    if not version:
        raise RuntimeError(f"{POM} has no zookeeper.version property")
    return version


def cache_dir() -> Path:
    base = os.environ.get("ONCELOG_ZOOKEEPER_CACHE")
    if base:
        # Absolute: Maven takes the classpath file's path relative to the pom's directory, not to ours.
        return Path(os.path.abspath(base))
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "oncelog" / f"zookeeper-{zookeeper_version()}"


def java_executable() -> str:
    """The `java` on PATH (8 or newer), or CoordinationUnavailable saying what is missing."""
    java = shutil.which("java")
    if java is None:
        raise CoordinationUnavailable(
            f"no `java` on PATH: the coordination service (ZooKeeper {zookeeper_version()}) needs Java {MIN_JAVA}+")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=JAVA_VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CoordinationUnavailable(f"`{java} -version` failed: {exc}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):   # 1.8 style
            major = int(match.group(2))
        if major < MIN_JAVA:
            raise CoordinationUnavailable(f"`java` is version {major}; ZooKeeper needs {MIN_JAVA}+")
    return java


def _dependency_plugin() -> str:
    """groupId:artifactId:version of the pom's pinned maven-dependency-plugin.

    The goal is named in full rather than as `dependency:build-classpath`: offline and with an empty ~/.m2 the
    prefix form fails with "No plugin found for prefix", which hides the network error that says why."""
    for plugin in ElementTree.parse(POM).getroot().iterfind("m:build/m:plugins/m:plugin", _NS):
        if plugin.findtext("m:artifactId", namespaces=_NS) == "maven-dependency-plugin":
            group = plugin.findtext("m:groupId", "org.apache.maven.plugins", _NS)
            return f"{group}:maven-dependency-plugin:{plugin.findtext('m:version', namespaces=_NS)}"
    raise RuntimeError(f"{POM} pins no maven-dependency-plugin")


def cached_classpath(cache: Path | None = None) -> str | None:
    """The cached classpath when every jar in it is still on disk, else None (Maven would have to run)."""
    path = (cache or cache_dir()) / f"classpath-{_pom_key()}.txt"
    if not path.is_file():
        return None
    classpath = path.read_text().strip()
    if classpath and all(Path(jar).is_file() for jar in classpath.split(os.pathsep)):
        return classpath
    return None


def zookeeper_classpath(cache: Path | None = None, timeout: float = RESOLVE_TIMEOUT_S) -> str:
    """ZooKeeper's server classpath: from the cache when its jars are all present, else from Maven.

    CoordinationUnavailable when `mvn` is missing or Maven Central cannot be reached (nothing resolved yet);
    RuntimeError when Maven fails for another reason (its output's tail included)."""
    cache = cache or cache_dir()
    classpath = cached_classpath(cache)
    if classpath is not None:
        return classpath
    version = zookeeper_version()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise CoordinationUnavailable(f"no `mvn` on PATH to resolve ZooKeeper {version}'s jars from Maven Central")
    cache.mkdir(parents=True, exist_ok=True)
    key = _pom_key()
    out = cache / f"classpath-{key}.{os.getpid()}.tmp"
    try:
        proc = subprocess.run([mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(POM),
                               f"{_dependency_plugin()}:build-classpath", f"-Dmdep.outputFile={out}"],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out.unlink(missing_ok=True)
        raise CoordinationUnavailable(f"`mvn dependency:build-classpath` for ZooKeeper {version} did not finish in "
                                      f"{timeout:.0f} s (Maven Central unreachable or very slow?)") from exc
    log = _ANSI.sub("", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        out.unlink(missing_ok=True)
        if _OFFLINE.search(log):
            first = next((ln for ln in log.splitlines() if _OFFLINE.search(ln)), "")
            raise CoordinationUnavailable(f"Maven Central not reachable to resolve ZooKeeper {version} "
                                          f"(and nothing in ~/.m2): {first.strip()[:300]}")
        raise RuntimeError(f"mvn could not resolve ZooKeeper's classpath from {POM}:\n{log[-3000:]}")
    classpath = out.read_text().strip()
    if f"zookeeper-{version}.jar" not in classpath:
        out.unlink(missing_ok=True)
        raise RuntimeError(f"mvn resolved a classpath without zookeeper-{version}.jar:\n{classpath[:2000]}")
    os.replace(out, cache / f"classpath-{key}.txt")
    return classpath


def _pom_key() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
