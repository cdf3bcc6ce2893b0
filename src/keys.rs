//! CURVE keys and the files that hold them, as `kv-events keygen` writes them.
//!
//! A key is 32 bytes, written as 40 characters of Z85 (ZeroMQ RFC 32). The files are the
//! certificate format of czmq's `zcert` (which pyzmq's `zmq.auth.load_certificate` also
//! reads): comment lines, then `public-key = "..."` and, in the secret file only,
//! `secret-key = "..."`. `NAME.key` holds both keys and is written mode 0600; `NAME.pub` holds
//! the public key and may be handed to anyone.
//!
//! Nothing here ever puts a secret key in an error: a [`KeyError`] names the file and what
//! is wrong with it, never the text it holds.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// The 85 characters of Z85, in the order of their values.
const Z85: &[u8; 85] =
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/// Characters of a key in Z85.
pub const Z85_KEY_LEN: usize = 40;

/// Why 40 characters are not a key in Z85. Never holds the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Z85Error {
    /// The text is not 40 characters long.
    Length {
        /// Its length, in bytes.
        found: usize,
    },
    /// A character is outside Z85's alphabet.
    NotZ85,
    /// A group of 5 characters stands for more than 32 bits.
    Overflow,
}

impl fmt::Display for Z85Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Z85Error::Length { found } => write!(
                f,
                "a key is {Z85_KEY_LEN} characters of Z85, this one has {found}"
            ),
            Z85Error::NotZ85 => f.write_str("a key has a character that is not Z85"),
            Z85Error::Overflow => f.write_str("a key is not valid Z85"),
        }
    }
}

impl std::error::Error for Z85Error {}

/// Why a key could not be made, read or written. Names the file, never a key.
#[derive(Debug)]
#[non_exhaustive]
pub enum KeyError {
    /// The libzmq linked in was built without CURVE.
    NoCurve,
    /// libzmq's generator failed.
    Generate(zmq::Error),
    /// A file or directory could not be read, created or written.
    Io {
        /// What was done to it: `"read"`, `"create"` or `"write"`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The reason the OS gave.
        source: io::Error,
    },
    /// A certificate has no `public-key` (or, for a secret one, `secret-key`) line.
    MissingLine {
        /// The certificate.
        path: PathBuf,
        /// `"public-key"` or `"secret-key"`.
        line: &'static str,
    },
    /// A certificate's line does not hold a key in Z85.
    InvalidKey {
        /// The certificate.
        path: PathBuf,
        /// `"public-key"` or `"secret-key"`.
        line: &'static str,
        /// What is wrong with it.
        why: Z85Error,
    },
    /// An allow-list directory holds no `.pub` file: it would admit nobody.
    EmptyAllowList {
        /// The directory.
        path: PathBuf,
    },
    /// A key file to be written exists already.
    Exists {
        /// The file.
        path: PathBuf,
    },
}

impl KeyError {
    fn io<'p>(action: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> KeyError + 'p {
        move |source| KeyError::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::NoCurve => {
                f.write_str("this libzmq was built without CURVE (zmq_has(\"curve\") is false)")
            }
            KeyError::Generate(e) => write!(f, "cannot make a key pair: {e}"),
            KeyError::Io {
                action,
                path,
                source,
            } => write!(f, "cannot {action} \"{}\": {source}", path.display()),
            KeyError::MissingLine { path, line } => {
                write!(f, "\"{}\" has no {line} line", path.display())
            }
            KeyError::InvalidKey { path, line, why } => {
                write!(f, "\"{}\": {line}: {why}", path.display())
            }
            KeyError::EmptyAllowList { path } => write!(
                f,
                "\"{}\" holds no .pub file: it would admit no subscriber",
                path.display()
            ),
            KeyError::Exists { path } => write!(
                f,
                "\"{}\" exists; keygen never replaces a key file (remove it first)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for KeyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeyError::Generate(e) => Some(e),
            KeyError::Io { source, .. } => Some(source),
            KeyError::InvalidKey { why, .. } => Some(why),
            _ => None,
        }
    }
}

/// One CURVE key, public or secret. `Debug` never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(pub [u8; 32]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// The key in Z85, 40 characters.
    pub fn to_z85(&self) -> String {
        let mut out = String::with_capacity(Z85_KEY_LEN);
        for chunk in self.0.chunks(4) {
            let mut value = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let mut digits = [0u8; 5];
            for digit in digits.iter_mut().rev() {
                *digit = Z85[(value % 85) as usize];
                value /= 85;
            }
            out.extend(digits.iter().map(|&d| d as char));
        }
        out
    }

    /// Decodes 40 characters of Z85. Unlike libzmq's `zmq_z85_decode`, refuses characters
    /// outside the alphabet and groups that overflow 32 bits rather than decode them into
    /// some other key. The error says what is wrong, without echoing the text.
    pub fn from_z85(text: &str) -> Result<Key, Z85Error> {
        let text = text.as_bytes();
        if text.len() != Z85_KEY_LEN {
            return Err(Z85Error::Length { found: text.len() });
        }
        let mut key = [0u8; 32];
        for (group, out) in text.chunks(5).zip(key.chunks_mut(4)) {
            let mut value: u64 = 0;
            for &c in group {
                let digit = Z85.iter().position(|&z| z == c).ok_or(Z85Error::NotZ85)?;
                value = value * 85 + digit as u64;
            }
            let value = u32::try_from(value).map_err(|_| Z85Error::Overflow)?;
            out.copy_from_slice(&value.to_be_bytes());
        }
        Ok(Key(key))
    }
}

/// A CURVE key pair, as `NAME.key` holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPair {
    /// The public key, which peers are given.
    pub public: Key,
    /// The secret key, which never leaves its owner.
    pub secret: Key,
}

impl KeyPair {
    /// A fresh key pair from libzmq's generator. Fails when libzmq was built without CURVE.
    pub fn generate() -> Result<KeyPair, KeyError> {
        curve_available()?;
        let pair = zmq::CurveKeyPair::new().map_err(KeyError::Generate)?;
        Ok(KeyPair {
            public: Key(pair.public_key),
            secret: Key(pair.secret_key),
        })
    }
}

/// `Ok` when the libzmq linked in speaks CURVE (`zmq_has("curve")`).
pub fn curve_available() -> Result<(), KeyError> {
    if zmq::has("curve") == Some(true) {
        Ok(())
    } else {
        Err(KeyError::NoCurve)
    }
}

/// The value of the line `name = "..."` of a certificate, if there is one.
fn certificate_value<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (key, value) = line.split_once('=')?;
            (key.trim() == name).then(|| value.trim().trim_matches(|c| c == '"' || c == '\''))
        })
}

fn read_certificate(path: &Path) -> Result<String, KeyError> {
    fs::read_to_string(path).map_err(KeyError::io("read", path))
}

fn key_of(text: &str, line: &'static str, path: &Path) -> Result<Key, KeyError> {
    let value = certificate_value(text, line).ok_or_else(|| KeyError::MissingLine {
        path: path.to_owned(),
        line,
    })?;
    Key::from_z85(value).map_err(|why| KeyError::InvalidKey {
        path: path.to_owned(),
        line,
        why,
    })
}

/// Reads the public key of a certificate (`NAME.pub`, or `NAME.key`).
pub fn read_public_key(path: &Path) -> Result<Key, KeyError> {
    key_of(&read_certificate(path)?, "public-key", path)
}

/// Reads the key pair of a secret certificate (`NAME.key`).
pub fn read_key_pair(path: &Path) -> Result<KeyPair, KeyError> {
    let text = read_certificate(path)?;
    Ok(KeyPair {
        public: key_of(&text, "public-key", path)?,
        secret: key_of(&text, "secret-key", path)?,
    })
}

/// The public keys of an allow-list: one `.pub` file, or every `*.pub` file of a directory
/// (not its subdirectories), with the file each came from. An empty directory is an error:
/// it would admit nobody, which is never what was meant.
pub fn read_allow_list(path: &Path) -> Result<Vec<(PathBuf, Key)>, KeyError> {
    let meta = fs::metadata(path).map_err(KeyError::io("read", path))?;
    if !meta.is_dir() {
        return Ok(vec![(path.to_owned(), read_public_key(path)?)]);
    }
    let entries = fs::read_dir(path).map_err(KeyError::io("read", path))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(KeyError::io("read", path))?;
        let file = entry.path();
        if file.extension().is_some_and(|e| e == "pub") && file.is_file() {
            files.push(file);
        }
    }
    if files.is_empty() {
        return Err(KeyError::EmptyAllowList {
            path: path.to_owned(),
        });
    }
    files.sort();
    files
        .into_iter()
        .map(|file| read_public_key(&file).map(|key| (file, key)))
        .collect()
}

/// Writes `NAME.key` (mode 0600: both keys) and `NAME.pub` (the public key) for `pair`,
/// refusing to replace either file. Returns the two paths.
pub fn write_key_files(name: &Path, pair: &KeyPair) -> Result<(PathBuf, PathBuf), KeyError> {
    let with = |ext: &str| {
        let mut path = name.as_os_str().to_owned();
        path.push(ext);
        PathBuf::from(path)
    };
    let (secret_path, public_path) = (with(".key"), with(".pub"));
    for path in [&secret_path, &public_path] {
        if path.symlink_metadata().is_ok() {
            return Err(KeyError::Exists { path: path.clone() });
        }
    }
    let public = pair.public.to_z85();
    write_new(
        &secret_path,
        0o600,
        &format!(
            "#   ****  Generated by kv-events keygen  ****\n\
             #   ZeroMQ CURVE **Secret** Certificate\n\
             #   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n\n\
             metadata\ncurve\n    public-key = \"{public}\"\n    secret-key = \"{}\"\n",
            pair.secret.to_z85()
        ),
    )?;
    write_new(
        &public_path,
        0o644,
        &format!(
            "#   ****  Generated by kv-events keygen  ****\n\
             #   ZeroMQ CURVE Public Certificate\n\
             #   Hand it to the peer that must admit or reach the owner of {}.\n\n\
             metadata\ncurve\n    public-key = \"{public}\"\n",
            secret_path.display()
        ),
    )?;
    Ok((secret_path, public_path))
}

/// Creates `path` with `mode` from the start (never a moment with a wider one) and writes
/// `text`; fails if it exists.
fn write_new(path: &Path, mode: u32, text: &str) -> Result<(), KeyError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(KeyError::io("create", path))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(KeyError::io("write", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z85_round_trips_and_agrees_with_libzmq() {
        let pair = KeyPair::generate().unwrap();
        let ours = pair.secret.to_z85();
        assert_eq!(ours, zmq::z85_encode(&pair.secret.0).unwrap());
        assert_eq!(Key::from_z85(&ours).unwrap(), pair.secret);
    }

    #[test]
    fn bad_z85_is_refused_without_echoing_it() {
        let good = KeyPair::generate().unwrap().secret.to_z85();
        let short = &good[..39];
        let bad_char = format!("{}\"", &good[..39]);
        let overflow = format!("{}{}", "#####", &good[5..]);
        for text in [short, bad_char.as_str(), overflow.as_str()] {
            let err = Key::from_z85(text).unwrap_err().to_string();
            assert!(!err.contains(&good[5..20]), "{err}");
        }
    }

    #[test]
    fn file_errors_are_kinds_a_caller_can_tell_apart() {
        let dir = std::env::temp_dir().join(format!("kv-events-keys-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let name = dir.join("a");
        write_key_files(&name, &KeyPair::generate().unwrap()).unwrap();
        let err = write_key_files(&name, &KeyPair::generate().unwrap()).unwrap_err();
        assert!(matches!(&err, KeyError::Exists { path } if path.ends_with("a.key")));
        assert!(
            err.to_string().contains("keygen never replaces a key file"),
            "{err}"
        );

        let err = read_key_pair(&dir.join("a.pub")).unwrap_err();
        assert!(
            matches!(
                err,
                KeyError::MissingLine {
                    line: "secret-key",
                    ..
                }
            ),
            "{err}"
        );
        let err = read_public_key(&dir.join("missing.pub")).unwrap_err();
        assert!(
            matches!(&err, KeyError::Io { action: "read", source, .. }
            if source.kind() == io::ErrorKind::NotFound),
            "{err}"
        );
        fs::write(dir.join("short.pub"), "public-key = \"abc\"\n").unwrap();
        let err = read_public_key(&dir.join("short.pub")).unwrap_err();
        assert!(matches!(
            err,
            KeyError::InvalidKey {
                why: Z85Error::Length { found: 3 },
                ..
            }
        ));
        assert_eq!(
            err.to_string(),
            format!(
                "\"{}\": public-key: a key is 40 characters of Z85, this one has 3",
                dir.join("short.pub").display()
            )
        );
        let empty = dir.join("empty");
        fs::create_dir(&empty).unwrap();
        assert!(matches!(
            read_allow_list(&empty),
            Err(KeyError::EmptyAllowList { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_never_shows_a_key() {
        let pair = KeyPair::generate().unwrap();
        let shown = format!("{pair:?}");
        assert!(!shown.contains(&pair.secret.to_z85()[..10]), "{shown}");
    }
}
