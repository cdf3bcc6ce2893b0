//! Who may connect to the publisher's sockets, read once from the flags when the config is
//! validated: the CURVE key pair (from its file), the allow-lists of public keys (from their
//! files) and of addresses, the mode of an `ipc://` socket file, and the bounds on
//! connections. The key files are read here and nowhere else, so what was validated is what
//! the sockets use, whatever happens to the files afterwards.

use super::Config;
use crate::error::CreateError;
use crate::keys::{self, Key, KeyPair};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

/// Who may connect, read once from the flags: the server's CURVE key pair, the allow-lists,
/// the mode of an ipc socket file, and the bounds on connections.
pub(crate) struct Access {
    pub(crate) curve: Option<KeyPair>,
    pub(crate) allowed_keys: Option<Vec<Key>>,
    pub(crate) allowed_addresses: Option<Vec<IpAddr>>,
    pub(crate) ipc_mode: u32,
    /// The bounds on connections, the total lowered to what the descriptor limit allows.
    pub(crate) limits: Limits,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys: only what is switched on.
        f.debug_struct("Access")
            .field("curve", &self.curve.is_some())
            .field("allowed_keys", &self.allowed_keys.as_ref().map(Vec::len))
            .field("allowed_addresses", &self.allowed_addresses)
            .field("ipc_mode", &format_args!("{:04o}", self.ipc_mode))
            .field("limits", &self.limits)
            .finish()
    }
}

/// `kv_events_ipc_mode`: up to four octal digits, at most 0777.
fn parse_ipc_mode(text: &str) -> Result<u32, CreateError> {
    let field = "kv_events_ipc_mode";
    let digits = text.strip_prefix("0o").unwrap_or(text);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return Err(CreateError::invalid(
            field,
            format!("\"{text}\" is not an octal file mode such as 0660"),
        ));
    }
    let mode = u32::from_str_radix(digits, 8).unwrap_or(u32::MAX);
    if mode > 0o777 {
        return Err(CreateError::invalid(
            field,
            format!(
                "\"{text}\" has bits beyond 0777 (no setuid, setgid or sticky bit on a socket)"
            ),
        ));
    }
    Ok(mode)
}

impl Access {
    /// Reads the key files and parses the lists of `config`; errors name the flag and the
    /// reason, never a key.
    pub(crate) fn read(config: &Config) -> Result<Access, CreateError> {
        let ipc_mode = parse_ipc_mode(&config.ipc_mode)?;
        let curve = if config.curve_secret_key_file.is_empty() {
            None
        } else {
            let field = "kv_events_curve_secret_key_file";
            keys::curve_available()
                .map_err(|why| CreateError::invalid(field, format!("is set, but {why}")))?;
            let path = Path::new(&config.curve_secret_key_file);
            Some(
                keys::read_key_pair(path).map_err(|why| CreateError::KeyFile {
                    field,
                    reason: why.to_string(),
                })?,
            )
        };
        let allowed_keys = if config.curve_allow.is_empty() {
            None
        } else {
            let field = "kv_events_curve_allow";
            if curve.is_none() {
                return Err(CreateError::invalid(
                    field,
                    "needs kv_events_curve_secret_key_file: an allow-list of public keys \
                     admits CURVE clients, and without a server key the socket speaks no CURVE",
                ));
            }
            let list = keys::read_allow_list(Path::new(&config.curve_allow)).map_err(|why| {
                CreateError::KeyFile {
                    field,
                    reason: why.to_string(),
                }
            })?;
            Some(list.into_iter().map(|(_, key)| key).collect())
        };
        let allowed_addresses = if config.null_allow_addresses.trim().is_empty() {
            None
        } else {
            let field = "kv_events_null_allow_addresses";
            if !config.bind_endpoint.starts_with("tcp://") {
                return Err(CreateError::invalid(
                    field,
                    "applies to tcp:// endpoints only (a peer on ipc:// has no address; \
                     use kv_events_ipc_mode)",
                ));
            }
            let mut addresses = Vec::new();
            for entry in config.null_allow_addresses.split(',').map(str::trim) {
                let address = entry.parse::<IpAddr>().map_err(|_| {
                    CreateError::invalid(
                        field,
                        format!("\"{entry}\" is not an IP address (a comma-separated list, e.g. 10.0.0.5,10.0.0.6)"),
                    )
                })?;
                addresses.push(canonical(address));
            }
            Some(addresses)
        };
        let limits = Limits::new(
            config.max_connections,
            config.max_connections_per_address,
            config.handshake_timeout_ms,
        );
        Ok(Access {
            curve,
            allowed_keys,
            allowed_addresses,
            ipc_mode,
            limits,
        })
    }

    /// What is switched on, for the log at start: never a key.
    pub(crate) fn describe(&self) -> String {
        let mut parts = vec![match (&self.curve, &self.allowed_keys) {
            (None, _) => "no encryption (NULL mechanism)".to_owned(),
            (Some(_), None) => {
                "CURVE: encrypted, any subscriber with the server's public key".to_owned()
            }
            (Some(_), Some(keys)) => format!(
                "CURVE: encrypted, {} allow-listed subscriber key{}",
                keys.len(),
                if keys.len() == 1 { "" } else { "s" }
            ),
        }];
        if let Some(addresses) = &self.allowed_addresses {
            let list: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
            parts.push(format!("peers from {} only", list.join(", ")));
        }
        parts.join("; ")
    }
}

/// The bounds on connections, as configured and as the descriptor limit allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections held at once on all of the publisher's sockets.
    pub(crate) total: u32,
    /// Connections one peer address may hold at once.
    pub(crate) per_address: u32,
    /// How long libzmq lets a handshake take.
    pub(crate) handshake_timeout: Duration,
}

impl Limits {
    /// `max_connections`, lowered to half the process's descriptor limit when that is
    /// smaller.
    pub(crate) fn new(max_connections: u32, per_address: u32, handshake_timeout_ms: u32) -> Limits {
        let half_limit = descriptor_limit().map_or(u64::MAX, |n| (n / 2).max(1));
        let total = u64::from(max_connections).min(half_limit) as u32;
        Limits {
            total,
            per_address: per_address.min(total),
            handshake_timeout: Duration::from_millis(u64::from(handshake_timeout_ms)),
        }
    }
}

/// The process's soft limit on open descriptors (`ulimit -n`), if it has one.
fn descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// An IPv4 address in IPv6 form (`::ffff:10.0.0.5`), as a dual-stack socket reports it,
/// compares as the IPv4 address.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_modes_are_octal_and_at_most_0777() {
        assert_eq!(parse_ipc_mode("0660").unwrap(), 0o660);
        assert_eq!(parse_ipc_mode("600").unwrap(), 0o600);
        assert_eq!(parse_ipc_mode("0o777").unwrap(), 0o777);
        for bad in ["", "0869", "rw-rw----", "4770", "07777", "1e3"] {
            let err = parse_ipc_mode(bad).unwrap_err().to_string();
            assert!(err.starts_with("kv_events_ipc_mode"), "{err}");
        }
    }

    #[test]
    fn the_bound_never_exceeds_half_the_descriptor_limit() {
        let limits = Limits::new(u32::MAX, 64, 3000);
        let half = descriptor_limit().map_or(u64::from(u32::MAX), |n| n / 2);
        assert_eq!(u64::from(limits.total), half.min(u64::from(u32::MAX)));
        let small = Limits::new(8, 64, 3000);
        assert_eq!((small.total, small.per_address), (8, 8));
    }

    #[test]
    fn mapped_ipv4_compares_as_ipv4() {
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(canonical(mapped), "127.0.0.1".parse::<IpAddr>().unwrap());
    }
}
