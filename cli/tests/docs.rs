//! README.md and docs/ agree with what a user runs: every relative link resolves, every page
//! is linked from the README and says who it is for, the options `kv-events` lists are the
//! ones docs/cli.md documents, and the flag table, the gflags of docs/wiring.md and the status
//! and metric tables of docs/operations.md match the code, and so does every count of the C
//! API's functions (tests/c_api.rs checks the headers' lists of fields).
//! Each side is read from its source (help output, `Config::default()`, `metrics_text()`),
//! so a new page, option, flag or metric is checked without a change here.

use mooncake_kv_events::{Config, Publisher};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    kv_events_testing::repo_root()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md, then every page of docs/, then the Mooncake integration kit's page, each with
/// its text.
fn pages() -> Vec<(PathBuf, String)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    paths.sort();
    paths.insert(0, root().join("README.md"));
    paths.push(root().join("integrations/mooncake/README.md"));
    paths.into_iter().map(|p| (p.clone(), read(&p))).collect()
}

fn page(name: &str) -> String {
    read(&root().join(name))
}

/// Each line of `text` with whether it is inside a fenced code block.
fn lines(text: &str) -> Vec<(bool, &str)> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else {
            out.push((in_code, line));
        }
    }
    out
}

/// The lines of `text` outside code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    lines(text)
        .into_iter()
        .filter(|(code, _)| !code)
        .map(|(_, line)| line)
}

/// The targets of the inline links `[...](target)` outside code.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            targets.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// The anchors GitHub gives the headings of `text`.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| {
            heading
                .trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

/// The rows of the table whose header's first cell is `first`, as trimmed cells with their
/// backticks removed.
fn table(text: &str, first: &str) -> Vec<Vec<String>> {
    let header = format!("| {first} |");
    let mut rows = prose(text).skip_while(|line| !line.starts_with(&header));
    assert!(rows.next().is_some(), "no table headed {header}");
    rows.skip(1)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            line.replace("\\|", "\u{0}")
                .trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().replace('`', "").replace('\u{0}', "|"))
                .collect()
        })
        .collect()
}

/// The `--options` named in `text`.
fn long_options(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.len() > 2 && word.starts_with("--"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in pages() {
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if file.is_empty() {
                path.clone()
            } else {
                path.parent().expect("a folder").join(file)
            };
            if !linked.exists() {
                broken.push(format!("{}: {target}: no such file", path.display()));
            } else if !anchor.is_empty() && !anchors(&read(&linked)).contains(anchor) {
                broken.push(format!("{}: {target}: no such heading", path.display()));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    assert!(checked > 0, "no relative link found");
}

#[test]
fn every_page_is_linked_from_the_readme_and_says_who_it_is_for() {
    let readme = links(&page("README.md"));
    for (path, text) in pages().into_iter().skip(1) {
        let name = path.strip_prefix(root()).unwrap().display().to_string();
        assert!(readme.contains(&name), "README.md does not link {name}");
        let first_paragraph = prose(&text)
            .skip(1)
            .find(|line| !line.trim().is_empty())
            .unwrap_or_default();
        assert!(
            first_paragraph.starts_with("For "),
            "{name} does not open with who it is for: {first_paragraph}"
        );
    }
}

fn kv_events(args: &[&str]) -> String {
    if args.first() == Some(&"relay") {
        relay_built();
    }
    let output = Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .args(args)
        .output()
        .expect("kv-events runs");
    assert!(output.status.success(), "kv-events {args:?}");
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

/// Builds the `kv-events-relay` binary beside `kv-events` when it is not there: `kv-events
/// relay` runs it, and the workspace's default members (what a plain `cargo test` builds)
/// leave it out so that the command never compiles the relay's NATS client.
fn relay_built() {
    let relay = Path::new(env!("CARGO_BIN_EXE_kv-events")).with_file_name("kv-events-relay");
    if relay.exists() {
        return;
    }
    // Into the same profile's folder as the binary under test.
    let release = relay.parent().is_some_and(|dir| dir.ends_with("release"));
    let status = Command::new(env!("CARGO"))
        .args(["build", "--locked", "-p", "kv-events-relay"])
        .args(release.then_some("--release"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cannot build kv-events-relay");
}

/// The lines of a help text's section (`Commands:`, `Options:`), up to the blank line.
fn section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|line| *line != title)
        .skip(1)
        .take_while(|line| !line.is_empty())
        .collect()
}

/// The commands `kv-events --help` lists, with the options each one's `-h` lists (besides
/// `--help` and `--version`).
fn commands_and_options() -> BTreeMap<String, BTreeSet<String>> {
    section(&kv_events(&["--help"]), "Commands:")
        .into_iter()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|command| *command != "help")
        .map(|command| {
            let help = kv_events(&[command, "-h"]);
            // In the summary each option is one line: its names, two spaces, its help.
            let options = section(&help, "Options:")
                .into_iter()
                .flat_map(|line| long_options(line.trim().split("  ").next().unwrap()))
                .filter(|option| option != "--help" && option != "--version")
                .collect();
            (command.to_owned(), options)
        })
        .collect()
}

#[test]
fn the_cli_page_documents_exactly_the_commands_and_options_of_the_help() {
    let cli = page("docs/cli.md");
    let mut documented = BTreeMap::new();
    let sections = cli.split("\n## kv-events ").skip(1);
    for section in sections {
        let (command, body) = section.split_once('\n').expect("a section");
        let section = body.split("\n## ").next().unwrap();
        let options: BTreeSet<String> = if section.contains("\n| option |") {
            table(section, "option")
                .iter()
                .flat_map(|row| long_options(&row[0]))
                .collect()
        } else {
            BTreeSet::new()
        };
        documented.insert(command.trim().to_owned(), options);
    }
    assert_eq!(documented, commands_and_options());
}

#[test]
fn command_lines_in_the_docs_use_only_options_that_exist() {
    let commands = commands_and_options();
    let mut wrong = Vec::new();
    for (path, text) in pages() {
        for (in_code, line) in lines(&text) {
            // Inline code spans are command lines of their own; a code block's line is one.
            let segments: Vec<&str> = if in_code {
                vec![line]
            } else {
                line.split('`').collect()
            };
            for segment in segments {
                let words: Vec<&str> = segment.split_whitespace().collect();
                for (at, word) in words.iter().enumerate() {
                    if !(*word == "kv-events" || word.ends_with("/kv-events")) {
                        continue;
                    }
                    // `cargo run --bin kv-events -- demo`, but not `cargo test --bin kv-events`.
                    let mut next = at + 1;
                    if words.get(next) == Some(&"--") {
                        next += 1;
                    } else if at > 0 && words[at - 1] == "--bin" {
                        continue;
                    }
                    let Some(command) = words.get(next) else {
                        continue;
                    };
                    let Some(options) = commands.get(*command) else {
                        if in_code && command.chars().all(|c| c.is_ascii_lowercase()) {
                            wrong.push(format!("{}: no command {command}: {line}", path.display()));
                        }
                        continue;
                    };
                    let args = words[next + 1..].iter().take_while(|w| {
                        !matches!(**w, "|" | ">" | ">>" | "&" | "&&" | ";") && !w.starts_with('#')
                    });
                    for arg in args.filter(|a| a.starts_with("--") && a.len() > 2) {
                        let option = arg.split('=').next().unwrap();
                        if !options.contains(option) && option != "--help" {
                            wrong.push(format!(
                                "{}: {command} has no {option}: {line}",
                                path.display()
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The fields of the Rust `Config` with their defaults, as `Debug` prints them (`false`,
/// `""`, `65536`).
fn config_defaults() -> BTreeMap<String, String> {
    format!("{:#?}", Config::default())
        .lines()
        .filter_map(|line| line.trim().strip_suffix(',')?.split_once(": "))
        .map(|(field, value)| (field.to_owned(), value.to_owned()))
        .collect()
}

/// The master's flag for a `Config` field: `kv_events_<field>`, but `enable_kv_events`.
fn flag_of(field: &str) -> String {
    if field == "enable_kv_events" {
        field.to_owned()
    } else {
        format!("kv_events_{field}")
    }
}

/// The README's flag table: field -> (flag, default).
fn flag_table() -> BTreeMap<String, (String, String)> {
    table(&page("README.md"), "master flag")
        .into_iter()
        .map(|row| (row[1].clone(), (row[0].clone(), row[2].clone())))
        .collect()
}

#[test]
fn the_flag_table_has_every_config_field_with_its_flag_and_default() {
    let expected: BTreeMap<String, (String, String)> = config_defaults()
        .into_iter()
        .map(|(field, default)| (field.clone(), (flag_of(&field), default)))
        .collect();
    assert!(expected.len() >= 11, "{expected:?}");
    assert_eq!(flag_table(), expected);
}

#[test]
fn the_wiring_page_defines_and_passes_on_every_flag_of_the_table() {
    let wiring = page("docs/wiring.md");
    let mut defined = BTreeMap::new();
    let mut passed = BTreeMap::new();
    for line in wiring.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("DEFINE_") {
            let args = rest.split_once('(').expect("DEFINE_type(").1;
            let mut args = args.splitn(3, ", ");
            let flag = args.next().unwrap().to_owned();
            defined.insert(flag, args.next().unwrap().to_owned());
        } else if let Some((field, flag)) = line
            .strip_prefix("c.")
            .and_then(|l| l.strip_suffix(';'))
            .and_then(|l| l.split_once(" = FLAGS_"))
        {
            passed.insert(field.to_owned(), flag.to_owned());
        }
    }
    let table = flag_table();
    let flag_defaults: BTreeMap<String, String> = table.values().cloned().collect();
    let field_flags: BTreeMap<String, String> = table
        .into_iter()
        .map(|(field, (flag, _))| (field, flag))
        .collect();
    assert_eq!(defined, flag_defaults, "DEFINE_* lines of docs/wiring.md");
    assert_eq!(passed, field_flags, "kv_events_config() of docs/wiring.md");
}

#[test]
fn the_operations_page_lists_every_status_field_and_metric() {
    let operations = page("docs/operations.md");
    let publisher = Publisher::disabled();

    let status: serde_json::Value =
        serde_json::from_str(&publisher.status_json()).expect("JSON status");
    let fields: BTreeSet<String> = status.as_object().unwrap().keys().cloned().collect();
    let documented: BTreeSet<String> = table(&operations, "field")
        .into_iter()
        .map(|row| row[0].clone())
        .collect();
    assert_eq!(documented, fields, "the status table of docs/operations.md");

    let metrics: BTreeMap<String, String> = publisher
        .metrics_text()
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect();
    let documented: BTreeMap<String, String> = table(&operations, "metric")
        .into_iter()
        .map(|row| (row[0].clone(), row[1].clone()))
        .collect();
    assert_eq!(
        documented, metrics,
        "the metric table of docs/operations.md"
    );
}

/// The functions `include/mooncake/kv_events_c.h` declares for export: each line
/// `MOONCAKE_KV_EVENTS_API <type> kv_events_NAME(...`, each name once.
fn c_api_functions() -> BTreeSet<String> {
    let header = page("include/mooncake/kv_events_c.h");
    let mut names = BTreeSet::new();
    for line in header.lines() {
        let Some(declaration) = line.strip_prefix("MOONCAKE_KV_EVENTS_API ") else {
            continue;
        };
        let call = declaration.split('(').next().unwrap_or_default();
        let name = call.rsplit([' ', '*']).next().unwrap_or_default();
        assert!(name.starts_with("kv_events_"), "{line}");
        assert!(names.insert(name.to_owned()), "{name} declared twice");
    }
    names
}

#[test]
fn the_pages_count_the_c_api_functions_the_header_declares() {
    let functions = c_api_functions();
    // Sanity: the calls a master makes, and the ones since.
    for name in [
        "kv_events_create",
        "kv_events_on_put_commit",
        "kv_events_version",
    ] {
        assert!(functions.contains(name), "{name} in {functions:?}");
    }
    // "N `kv_events_*` functions", a line break allowed between the words.
    let mut counts = 0;
    for (path, text) in pages() {
        let words: Vec<&str> = text.split_whitespace().collect();
        for (i, pair) in words.windows(3).enumerate() {
            if pair[1] != "`kv_events_*`" || !pair[2].starts_with("functions") {
                continue;
            }
            let number = pair[0].trim_start_matches('(');
            assert_eq!(
                number.parse::<usize>().ok(),
                Some(functions.len()),
                "{}: word {i}: \"{}\", while include/mooncake/kv_events_c.h declares {} \
                 functions",
                path.display(),
                pair.join(" "),
                functions.len()
            );
            counts += 1;
        }
    }
    assert!(counts >= 1, "docs/wiring.md counts the C API's functions");
}
