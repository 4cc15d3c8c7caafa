"""A route's egress policy: the destinations a unit may reach through its egress proxy, and nothing else.

A route names it under ``egress:`` (a task may narrow it, never widen it)::

    egress:
      allow: [pypi.org, "*.pythonhosted.org", 198.18.5.0/24]   # domains, "*." wildcards, CIDRs
      deny: [evil.pypi.org, 10.0.0.0/8]                        # these win over allow
      ports: [80, 443]                                         # the default

Matching (:meth:`EgressPolicy.verdict`, used by the proxy on every attempt, after it resolved the name itself):

- ``example.com`` matches that name only; ``*.example.com`` matches every name below it (``a.example.com``,
  ``a.b.example.com``), not ``example.com`` itself. Names are compared lowercased, without a trailing dot.
- A CIDR in ``allow`` admits a destination given as an address in it; a CIDR in ``deny`` refuses any
  destination that is, or resolves to, an address in it (so an allowed name that resolves to a private
  address is still refused when that range is denied).
- Always refused, whatever the policy says: loopback, link-local (the clouds' metadata address), multicast and
  unspecified addresses; the proxy adds this host's own addresses.
- No entry in ``allow``: nothing is reached (the default of a route without ``egress`` is no network at all).

Entries are validated strictly: an IP address where a name is expected is refused (write it as a CIDR,
``1.2.3.4/32``), as are a bare ``*``, a wildcard over a top-level domain, a URL or a ``host:port``.
This module is a config model: it imports nothing of ours but :mod:`ale_iac.errors`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL: Final = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_DOMAIN_RE: Final = re.compile(rf"^{_LABEL}(\.{_LABEL})+$")
DEFAULT_PORTS: Final = (80, 443)
ALWAYS_DENIED: Final[tuple[IpNetwork, ...]] = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "224.0.0.0/4",
        "::/128",
        "::1/128",
        "fe80::/10",
        "ff00::/8",
    )
)
"""Never reached through the proxy: they would lead to the proxy's own host (loopback), a cloud's metadata
server (link-local), or nowhere meaningful."""


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def check_entry(entry: str) -> str:
    """One allow or deny entry, normalised (lowercase), or a ValueError that says what is wrong with it."""
    text = entry.strip().lower().rstrip(".")
    if "/" in text and not text.startswith(("http:", "https:")):
        try:
            return str(ipaddress.ip_network(text, strict=True))
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not a CIDR: {exc}") from None
    if _is_address(text):
        raise ValueError(f"{entry!r} is an IP address where a domain is expected: write it as a CIDR ({text}/32)")
    if "://" in text or text.startswith(("http:", "https:")):
        raise ValueError(f"{entry!r} is a URL: give the domain alone (ports go in 'ports')")
    if ":" in text:
        raise ValueError(f"{entry!r} has a port: give the domain alone and the port in 'ports'")
    if text in ("*", "*.") or text == "":
        raise ValueError(f"{entry!r} would allow every name: use allow_outbound: true for everything")
    name = text[2:] if text.startswith("*.") else text
    if "*" in name:
        raise ValueError(f"{entry!r}: a wildcard is only '*.' at the start of a domain")
    if text.startswith("*.") and "." not in name:
        raise ValueError(f"{entry!r} is a wildcard over a top-level domain")
    if not _DOMAIN_RE.match(name):
        raise ValueError(f"{entry!r} is neither a domain (labels of letters, digits, '-', at least two) nor a CIDR")
    return text


Entry = Annotated[str, AfterValidator(check_entry)]


def _check_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is not between 1 and 65535")
    return port


Port = Annotated[int, AfterValidator(_check_port)]


def _resolver(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address (the DNS server the proxy asks)") from None


class Verdict(BaseModel):
    """What the proxy decided for one attempt, and why (the rule that decided, for the record)."""

    model_config = ConfigDict(frozen=True)

    allowed: bool
    reason: str


def _name_matches(rule: str, name: str) -> bool:
    if rule.startswith("*."):
        return name.endswith(rule[1:]) and len(name) > len(rule) - 1
    return name == rule


class EgressPolicy(BaseModel):
    """Where a unit may connect through its egress proxy (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[Entry] = Field(default_factory=list, description="Domains, '*.' wildcards and CIDRs reached.")
    deny: list[Entry] = Field(default_factory=list, description="Domains, wildcards and CIDRs refused (deny wins).")
    ports: list[Port] = Field(
        default_factory=lambda: list(DEFAULT_PORTS), min_length=1, description="Destination ports reached."
    )
    resolver: Annotated[str, AfterValidator(_resolver)] | None = Field(
        default=None, description="The DNS server the proxy asks (an address); none: this host's resolver."
    )

    def names(self, entries: list[str]) -> list[str]:
        return [entry for entry in entries if "/" not in entry]

    def networks(self, entries: list[str]) -> list[IpNetwork]:
        return [ipaddress.ip_network(entry) for entry in entries if "/" in entry]

    def verdict(
        self, host: str, port: int, addresses: list[IpAddress], host_addresses: frozenset[str] = frozenset()
    ) -> Verdict:
        """Whether ``host:port`` may be reached, ``addresses`` being what the proxy resolved it to (or the
        address itself). Deny wins; every address must pass (a name with one denied address is refused)."""
        name = host.strip("[]").lower().rstrip(".")
        literal = _is_address(name)
        if port not in self.ports:
            return Verdict(allowed=False, reason=f"port {port} is not in ports")
        if not addresses:
            return Verdict(allowed=False, reason="the name does not resolve")
        for address in addresses:
            if str(address) in host_addresses or any(address in net for net in ALWAYS_DENIED):
                return Verdict(allowed=False, reason=f"{address} is this host or a reserved address")
            denied = next(
                (net for net in self.networks(self.deny) if address.version == net.version and address in net), None
            )
            if denied is not None:
                return Verdict(allowed=False, reason=f"deny {denied}")
        if not literal:
            rule = next((rule for rule in self.names(self.deny) if _name_matches(rule, name)), None)
            if rule is not None:
                return Verdict(allowed=False, reason=f"deny {rule}")
            rule = next((rule for rule in self.names(self.allow) if _name_matches(rule, name)), None)
            if rule is not None:
                return Verdict(allowed=True, reason=f"allow {rule}")
            return Verdict(allowed=False, reason="no allow entry matches the name")
        net = next(
            (n for n in self.networks(self.allow) if addresses[0].version == n.version and addresses[0] in n), None
        )
        if net is not None:
            return Verdict(allowed=True, reason=f"allow {net}")
        return Verdict(allowed=False, reason="no allow entry matches the address")

    def narrowed_by(self, task: EgressPolicy) -> EgressPolicy:
        """The policy a task's own ``egress`` leaves: its allow entries (each covered by one of this policy's),
        both deny lists, its ports (each one of this policy's). A ValueError names what would widen it."""
        wider = [entry for entry in task.allow if not self._covers(entry)]
        wider += [f"port {port}" for port in task.ports if port not in self.ports]
        if task.resolver is not None and task.resolver != self.resolver:
            wider.append(f"resolver {task.resolver}")
        if wider:
            raise ValueError(
                f"a task may only narrow its route's egress policy; not covered by the route: {', '.join(wider)}"
            )
        deny = list(dict.fromkeys([*self.deny, *task.deny]))
        return EgressPolicy(allow=task.allow, deny=deny, ports=task.ports, resolver=self.resolver)

    def _covers(self, entry: str) -> bool:
        if "/" in entry:
            net = ipaddress.ip_network(entry)
            return any(net.version == own.version and net.subnet_of(own) for own in self.networks(self.allow))  # type: ignore[arg-type]
        name = entry[2:] if entry.startswith("*.") else entry
        for rule in self.names(self.allow):
            if entry == rule or (rule.startswith("*.") and _name_matches(rule, name)):
                return True
        return False

    def summary(self) -> str:
        """One line for plans and records."""
        allow = ", ".join(self.allow) or "nothing"
        deny = f"; deny {', '.join(self.deny)}" if self.deny else ""
        return f"proxy: allow {allow}{deny}; ports {', '.join(map(str, self.ports))}"
