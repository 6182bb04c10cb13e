//! Which devices exist: `SOFTRDMA_DEVICES`, else the file `SOFTRDMA_CONFIG` names, else
//! `/etc/softrdma.conf`, else one device `softrdma0` on 127.0.0.1. Format: docs/IBVERBS.md.

use std::net::Ipv4Addr;

/// Most devices a configuration may declare.
pub const MAX_DEVICES: usize = 64;
/// Default configuration file.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/softrdma.conf";
/// `IBV_MTU_1024`: the active MTU of a device whose address is on no interface here (what rxe
/// reports on an Ethernet MTU of 1500).
pub const DEFAULT_ACTIVE_MTU: i32 = 3;
/// `active_mtu` of an entry that names none: follow the interface ([`crate::ifmtu`]).
pub const MTU_FROM_INTERFACE: i32 = 0;

/// One device: its name, the IPv4 address it binds (`<addr>:4791`), its active path MTU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// `ibv_get_device_name`.
    pub name: String,
    /// The address the device binds; its GID is `::ffff:<addr>`.
    pub addr: Ipv4Addr,
    /// Active MTU as `enum ibv_mtu` (1 = 256 .. 5 = 4096); [`MTU_FROM_INTERFACE`] until the
    /// device table resolves it ([`DeviceConfig::resolve_mtu`]).
    pub active_mtu: i32,
}

impl DeviceConfig {
    /// An entry that named no MTU takes the one of the interface its address is on (as rxe),
    /// or [`DEFAULT_ACTIVE_MTU`] when its address is on none.
    pub fn resolve_mtu(mut self) -> DeviceConfig {
        if self.active_mtu == MTU_FROM_INTERFACE {
            self.active_mtu = crate::ifmtu::interface_mtu(self.addr)
                .map_or(DEFAULT_ACTIVE_MTU, crate::ifmtu::active_mtu_for);
        }
        self
    }
}

/// `enum ibv_mtu` of a byte count.
pub fn mtu_enum(bytes: u32) -> Option<i32> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() < crate::abi::IBV_SYSFS_NAME_MAX
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One entry `[name=]a.b.c.d[@mtu]`; `index` names it `softrdma<index>` when unnamed.
fn parse_entry(entry: &str, index: usize) -> Result<DeviceConfig, String> {
    let (name, rest) = match entry.split_once('=') {
        Some((n, r)) => (n.trim().to_string(), r.trim()),
        None => (format!("softrdma{index}"), entry.trim()),
    };
    let (addr, mtu) = match rest.split_once('@') {
        Some((a, m)) => {
            let bytes: u32 = m
                .trim()
                .parse()
                .map_err(|_| format!("{entry:?}: MTU {m:?} is not a number"))?;
            let mtu = mtu_enum(bytes)
                .ok_or_else(|| format!("{entry:?}: MTU must be 256, 512, 1024, 2048 or 4096"))?;
            (a.trim(), mtu)
        }
        None => (rest, MTU_FROM_INTERFACE),
    };
    let addr: Ipv4Addr = addr
        .parse()
        .map_err(|_| format!("{entry:?}: {addr:?} is not an IPv4 address"))?;
    if !valid_name(&name) {
        return Err(format!(
            "{entry:?}: a device name is 1-63 characters of [A-Za-z0-9_-]"
        ));
    }
    Ok(DeviceConfig {
        name,
        addr,
        active_mtu: mtu,
    })
}

fn check(devs: Vec<DeviceConfig>) -> Result<Vec<DeviceConfig>, String> {
    if devs.len() > MAX_DEVICES {
        return Err(format!("more than {MAX_DEVICES} devices"));
    }
    for (i, d) in devs.iter().enumerate() {
        for e in &devs[..i] {
            if e.name == d.name {
                return Err(format!("device name {} appears twice", d.name));
            }
            if e.addr == d.addr {
                return Err(format!(
                    "devices {} and {} both use {} (each device binds its own address)",
                    e.name, d.name, d.addr
                ));
            }
        }
    }
    Ok(devs)
}

/// Parse the value of `SOFTRDMA_DEVICES`: entries separated by commas (or whitespace).
pub fn parse_list(s: &str) -> Result<Vec<DeviceConfig>, String> {
    let devs = s
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|e| !e.is_empty())
        .enumerate()
        .map(|(i, e)| parse_entry(e, i))
        .collect::<Result<Vec<_>, _>>()?;
    check(devs)
}

/// Parse a configuration file: one device per line, `name address [mtu=N]`; `#` starts a
/// comment; blank lines are ignored.
pub fn parse_file(text: &str) -> Result<Vec<DeviceConfig>, String> {
    let mut devs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let err = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        let (name, addr) = match words.as_slice() {
            [name, addr, ..] => (*name, *addr),
            _ => return Err(err("expected `name address [mtu=N]`")),
        };
        let mut entry = format!("{name}={addr}");
        for opt in &words[2..] {
            match opt.split_once('=') {
                Some(("mtu", v)) => entry = format!("{entry}@{v}"),
                _ => return Err(err("unknown option (only mtu=N)")),
            }
        }
        devs.push(parse_entry(&entry, devs.len()).map_err(|e| err(&e))?);
    }
    check(devs)
}

/// The devices of this process, from the environment or the configuration file.
pub fn load() -> Result<Vec<DeviceConfig>, String> {
    if let Ok(s) = std::env::var("SOFTRDMA_DEVICES")
        && !s.trim().is_empty()
    {
        return parse_list(&s).map_err(|e| format!("SOFTRDMA_DEVICES: {e}"));
    }
    let (path, explicit) = match std::env::var("SOFTRDMA_CONFIG") {
        Ok(p) if !p.is_empty() => (p, true),
        _ => (DEFAULT_CONFIG_FILE.to_string(), false),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_file(&text).map_err(|e| format!("{path}: {e}")),
        Err(e) if explicit || e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("{path}: {e}"))
        }
        Err(_) => parse_list("softrdma0=127.0.0.1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_forms() {
        let d = parse_list("softrdma0=127.0.0.1,softrdma1=127.0.0.2@4096").unwrap();
        assert_eq!(d[1].name, "softrdma1");
        assert_eq!(d[1].addr, Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(d[1].active_mtu, 5);
        assert_eq!(d[0].active_mtu, MTU_FROM_INTERFACE);
        let d = parse_list("127.0.0.1, 127.0.0.2").unwrap();
        assert_eq!(d[1].name, "softrdma1");
        assert!(parse_list("127.0.0.1,127.0.0.1").is_err());
        assert!(parse_list("a=1.2.3").is_err());
        assert!(parse_list("a=1.2.3.4@1500").is_err());
        assert!(parse_list("a/b=1.2.3.4").is_err());
    }

    #[test]
    fn file_form() {
        let d = parse_file("# devices\nsoftrdma0 127.0.0.1\n\nsoftrdma1 10.0.0.1 mtu=2048 # x\n")
            .unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].active_mtu, 4);
        assert!(parse_file("softrdma0").is_err());
        assert!(parse_file("softrdma0 1.2.3.4 speed=9").is_err());
    }
}
