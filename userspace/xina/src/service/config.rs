//! The service file: where the API listens, the switch's address, leases,
//! the job ids it gives out, which port each host is behind, and tenants.

use std::{
    collections::HashSet,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
};

use serde::Deserialize;

use crate::config::{ConfigError, toml_error};

/// The service file (TOML).
///
/// ```toml
/// listen = "10.77.0.253:9870"        # the API's address
/// switch_addr = "10.77.0.254:19860"  # where members send xina packets
/// lease_secs = 30                    # a job not renewed for this long is removed
/// job_ids = [1000, 1999]             # ids the service gives out (others are the operator's)
///
/// [[hosts]]                          # which switch port a member's address is behind
/// prefix = "10.77.0.0/30"            # (longest prefix wins)
/// port = "sp0"
///
/// [[tenants]]
/// name = "physics"
/// token = "a secret of at least 16 characters"
/// max_jobs = 4                       # jobs and groups at once
/// max_slots = 256                    # aggregator slots they hold together
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceFile {
    pub listen: SocketAddr,
    pub switch_addr: SocketAddrV4,
    #[serde(default = "default_lease_secs")]
    pub lease_secs: u64,
    #[serde(default = "default_job_ids")]
    pub job_ids: [u32; 2],
    #[serde(default)]
    pub hosts: Vec<HostEntry>,
    pub tenants: Vec<TenantEntry>,
}

/// A `[[hosts]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    pub prefix: String,
    pub port: String,
}

/// A `[[tenants]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    pub name: String,
    pub token: String,
    #[serde(default = "default_max_jobs")]
    pub max_jobs: u32,
    #[serde(default = "default_max_slots")]
    pub max_slots: u32,
}

const fn default_lease_secs() -> u64 {
    30
}

const fn default_job_ids() -> [u32; 2] {
    [1000, 1999]
}

const fn default_max_jobs() -> u32 {
    4
}

const fn default_max_slots() -> u32 {
    256
}

/// Shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// A checked service file.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    pub file: ServiceFile,
    /// `(network, prefix length, port)`, longest prefix first.
    routes: Vec<(u32, u8, String)>,
}

impl ServiceConfig {
    /// Parses and checks a service file's text.
    ///
    /// # Errors
    /// The first problem, naming its field.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: ServiceFile = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        Self::new(file)
    }

    /// Checks a service file.
    ///
    /// # Errors
    /// The first problem, naming its field.
    pub fn new(file: ServiceFile) -> Result<Self, ConfigError> {
        let bad = |field: String, message: String| ConfigError { field, message };
        if file.lease_secs == 0 || file.lease_secs > 86_400 {
            return Err(bad(
                "lease_secs".into(),
                format!("{} (must be 1..=86400 seconds)", file.lease_secs),
            ));
        }
        let [first, last] = file.job_ids;
        if first == 0 || first > last {
            return Err(bad(
                "job_ids".into(),
                format!("[{first}, {last}] (must be [first, last] with 1 <= first <= last)"),
            ));
        }
        let mut routes = Vec::with_capacity(file.hosts.len());
        for (i, h) in file.hosts.iter().enumerate() {
            let (net, len) = parse_prefix(&h.prefix)
                .map_err(|m| bad(format!("hosts[{i}].prefix"), format!("{:?}: {m}", h.prefix)))?;
            if routes.iter().any(|&(n, l, _)| (n, l) == (net, len)) {
                return Err(bad(
                    format!("hosts[{i}].prefix"),
                    format!("{} is listed twice", h.prefix),
                ));
            }
            if h.port.is_empty() {
                return Err(bad(format!("hosts[{i}].port"), "empty".into()));
            }
            routes.push((net, len, h.port.clone()));
        }
        routes.sort_by_key(|r| std::cmp::Reverse(r.1));
        if file.tenants.is_empty() {
            return Err(bad(
                "tenants".into(),
                "none (a [[tenants]] entry with a name and a token lets clients in)".into(),
            ));
        }
        let (mut names, mut tokens) = (HashSet::new(), HashSet::new());
        for (i, t) in file.tenants.iter().enumerate() {
            let at = |f: &str| format!("tenants[{i}].{f}");
            let name_ok = !t.name.is_empty()
                && t.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !name_ok {
                return Err(bad(
                    at("name"),
                    format!("{:?} (letters, digits, '-' and '_' only)", t.name),
                ));
            }
            if !names.insert(t.name.as_str()) {
                return Err(bad(at("name"), format!("{} is listed twice", t.name)));
            }
            if t.token.len() < MIN_TOKEN_LEN || t.token.chars().any(char::is_whitespace) {
                return Err(bad(
                    at("token"),
                    format!("at least {MIN_TOKEN_LEN} characters, no spaces"),
                ));
            }
            if !tokens.insert(t.token.as_str()) {
                return Err(bad(at("token"), "the same as another tenant's".into()));
            }
            if t.max_jobs == 0 {
                return Err(bad(
                    at("max_jobs"),
                    "0 (a tenant needs at least one)".into(),
                ));
            }
            if t.max_slots == 0 {
                return Err(bad(
                    at("max_slots"),
                    "0 (a tenant needs at least one)".into(),
                ));
            }
        }
        Ok(Self { file, routes })
    }

    /// The switch port behind which `ip` sits (longest matching prefix).
    pub fn port_for(&self, ip: Ipv4Addr) -> Option<&str> {
        let ip = u32::from(ip);
        self.routes
            .iter()
            .find(|&&(net, len, _)| ip & mask(len) == net)
            .map(|(_, _, port)| port.as_str())
    }

    /// The tenant (index into `tenants`) whose token `authorization` (an
    /// `Authorization` header's value) carries.
    pub fn tenant(&self, authorization: &str) -> Option<usize> {
        let token = authorization.strip_prefix("Bearer ")?.trim();
        // Compare with every token, in time independent of where they differ.
        self.file
            .tenants
            .iter()
            .enumerate()
            .fold(None, |found, (i, t)| {
                if same_secret(t.token.as_bytes(), token.as_bytes()) {
                    Some(i)
                } else {
                    found
                }
            })
    }
}

fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

const fn mask(len: u8) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

/// `"10.77.0.0/24"` as a network and a length; host bits must be 0.
fn parse_prefix(s: &str) -> Result<(u32, u8), String> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| "not ADDRESS/LENGTH".to_owned())?;
    let ip: Ipv4Addr = ip.parse().map_err(|e| format!("the address: {e}"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| "the length must be 0..=32".to_owned())?;
    let net = u32::from(ip);
    if net & !mask(len) != 0 {
        return Err(format!(
            "host bits set (the network is {})",
            Ipv4Addr::from(net & mask(len))
        ));
    }
    Ok((net, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
listen = "127.0.0.1:0"
switch_addr = "10.77.0.254:19860"
[[hosts]]
prefix = "10.77.0.0/24"
port = "sp-all"
[[hosts]]
prefix = "10.77.0.2/32"
port = "sp2"
[[tenants]]
name = "physics"
token = "0123456789abcdef"
[[tenants]]
name = "bio"
token = "fedcba9876543210"
max_jobs = 1
"#;

    fn config() -> ServiceConfig {
        ServiceConfig::parse(FILE).unwrap()
    }

    fn refused(text: &str) -> ConfigError {
        ServiceConfig::parse(text).expect_err("accepted")
    }

    #[test]
    fn defaults_and_longest_prefix() {
        let c = config();
        assert_eq!(c.file.lease_secs, 30);
        assert_eq!(c.file.job_ids, [1000, 1999]);
        assert_eq!(c.file.tenants[0].max_jobs, 4);
        assert_eq!(c.file.tenants[1].max_slots, 256);
        assert_eq!(c.port_for(Ipv4Addr::new(10, 77, 0, 2)), Some("sp2"));
        assert_eq!(c.port_for(Ipv4Addr::new(10, 77, 0, 3)), Some("sp-all"));
        assert_eq!(c.port_for(Ipv4Addr::new(10, 78, 0, 3)), None);
    }

    #[test]
    fn tokens_name_their_tenant_and_nothing_else() {
        let c = config();
        assert_eq!(c.tenant("Bearer 0123456789abcdef"), Some(0));
        assert_eq!(c.tenant("Bearer fedcba9876543210"), Some(1));
        assert_eq!(c.tenant("Bearer 0123456789abcdeF"), None);
        assert_eq!(c.tenant("Bearer 0123456789abcde"), None);
        assert_eq!(c.tenant("0123456789abcdef"), None);
        assert_eq!(c.tenant("Basic 0123456789abcdef"), None);
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_field() {
        let cases = [
            (FILE.replace("sp2", ""), "hosts[1].port"),
            (
                FILE.replace("10.77.0.2/32", "10.77.0.2/33"),
                "hosts[1].prefix",
            ),
            (
                FILE.replace("10.77.0.2/32", "10.77.0.0/24"),
                "hosts[1].prefix",
            ),
            (
                FILE.replace("10.77.0.0/24", "10.77.0.1/24"),
                "hosts[0].prefix",
            ),
            (
                FILE.replace("fedcba9876543210", "short"),
                "tenants[1].token",
            ),
            (
                FILE.replace("fedcba9876543210", "0123456789abcdef"),
                "tenants[1].token",
            ),
            (FILE.replace("\"bio\"", "\"physics\""), "tenants[1].name"),
            (FILE.replace("\"bio\"", "\"b i o\""), "tenants[1].name"),
            (
                FILE.replace("max_jobs = 1", "max_jobs = 0"),
                "tenants[1].max_jobs",
            ),
            (format!("lease_secs = 0\n{FILE}"), "lease_secs"),
            (format!("job_ids = [5, 4]\n{FILE}"), "job_ids"),
        ];
        for (text, field) in cases {
            let e = refused(&text);
            assert_eq!(e.field, field, "{e}");
        }
        let e = refused(&format!("colour = 1\n{FILE}"));
        assert!(e.to_string().contains("colour"), "{e}");
        let e = refused("listen = \"127.0.0.1:0\"\nswitch_addr = \"10.0.0.1:1\"\ntenants = []\n");
        assert_eq!(e.field, "tenants");
    }
}
