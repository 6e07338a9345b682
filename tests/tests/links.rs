//! The repository stands alone: every Markdown link, and every path to a Markdown file or
//! into `docs/`, in its documentation, sources and scripts resolves to a file or folder in the
//! repository itself. A reader who clones it has nothing else, so a reference to a file
//! beside the repository (a folder next to the clone, a design note that never was
//! committed) is an error here, not a dead end for them.
//!
//! What is checked, in `.md`, `.rs`, `.toml`, `.sh` and `.service` files and the scripts in
//! `.ci` (not in `target` or `.git`):
//! - a Markdown link's target (`[text](target)` in `.md` files), unless it is a URL or an
//!   anchor: relative to the file's folder;
//! - a word that looks like a path and names a Markdown file (`docs/cli.md`, `BENCHMARKS.md`)
//!   or starts with one of [`CHECKED_PREFIXES`]: relative to the repository's root or to the
//!   file's folder;
//! - a word that starts with one of [`OUTSIDE_PREFIXES`]: it must stay inside the repository
//!   (in Rust sources, only `/work/`: there a `../` word is test data, such as a path an
//!   API must refuse, unless it names a Markdown file, which the rule above checks).
//!
//! This file itself is not checked: it spells the patterns it looks for.

use std::fs;
use std::path::{Component, Path, PathBuf};

/// File name endings whose text is checked.
const CHECKED_EXTENSIONS: [&str; 5] = ["md", "rs", "toml", "sh", "service"];
/// Folders never looked into: build output and Git's own.
const SKIPPED_FOLDERS: [&str; 2] = ["target", ".git"];
/// Hidden folders that are looked into all the same (their files need no extension).
const CHECKED_HIDDEN_FOLDERS: [&str; 1] = [".ci"];
/// Files larger than this are not text we wrote; they are skipped.
const FILE_BYTES_MAX: u64 = 4 << 20;
/// Words starting with these must name a file or folder in the repository.
const CHECKED_PREFIXES: [&str; 2] = ["docs/", "spec/"];
/// Words starting with these lead out of their folder: they must stay in the repository.
const OUTSIDE_PREFIXES: [&str; 2] = ["../", "/work/"];
/// This file, relative to the repository's root.
const THIS_FILE: &str = "tests/tests/links.rs";

/// The repository's root: the folder above this crate.
fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository's root")
        .to_path_buf()
}

/// Every checked file under `root`, in a stable order.
fn checked_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![(root.to_path_buf(), false)];
    while let Some((folder, in_hidden)) = folders.pop() {
        let Ok(entries) = fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                let hidden = name.starts_with('.');
                if SKIPPED_FOLDERS.contains(&name.as_str())
                    || (hidden && !CHECKED_HIDDEN_FOLDERS.contains(&name.as_str()))
                {
                    continue;
                }
                folders.push((path, in_hidden || hidden));
            } else if kind.is_file() {
                let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
                let small = entry
                    .metadata()
                    .is_ok_and(|metadata| metadata.len() <= FILE_BYTES_MAX);
                if small && (in_hidden || CHECKED_EXTENSIONS.contains(&extension)) {
                    files.push(path);
                }
            }
        }
    }
    files.sort();
    files
}

/// `path` without `.` and `..` components, lexically; `None` when it climbs above its start.
fn normalised(path: &Path) -> Option<PathBuf> {
    let mut parts: Vec<Component> = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => match parts.last() {
                Some(Component::Normal(_)) => {
                    parts.pop();
                }
                _ => return None,
            },
            other => parts.push(other),
        }
    }
    Some(parts.iter().collect())
}

/// Whether `target`, taken relative to `base` (a folder inside `root`), names an existing
/// file or folder that stays inside `root`.
fn resolves_inside(root: &Path, base: &Path, target: &str) -> bool {
    let relative_base = base.strip_prefix(root).unwrap_or(Path::new(""));
    let Some(inside) = normalised(&relative_base.join(target)) else {
        return false;
    };
    !inside.has_root() && root.join(inside).exists()
}

/// The targets of the Markdown links on `line`: what stands between `](` and `)`.
fn markdown_link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find("](") {
        rest = &rest[start + 2..];
        let Some(end) = rest.find(')') else {
            break;
        };
        // `[text](target "title")`: the target is the first word.
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_start_matches('<').trim_end_matches('>'));
        rest = &rest[end..];
    }
    targets
}

/// The path-like words on `line`: runs of characters a path is written with here, outside
/// URLs.
fn path_words(line: &str) -> impl Iterator<Item = &str> {
    line.split_whitespace()
        .filter(|chunk| !chunk.contains("://"))
        .flat_map(|chunk| {
            chunk.split(|character: char| {
                !(character.is_ascii_alphanumeric() || matches!(character, '_' | '.' | '/' | '-'))
            })
        })
        .map(|word| word.trim_end_matches('.'))
        .filter(|word| !word.is_empty())
}

/// Whether `word` must resolve: it names a Markdown file, or points into `docs/` or `spec/`.
fn is_reference(word: &str) -> bool {
    let names_markdown = word
        .strip_suffix(".md")
        .is_some_and(|stem| stem.rsplit('/').next().is_some_and(|file| !file.is_empty()));
    names_markdown
        || CHECKED_PREFIXES
            .iter()
            .any(|prefix| word.starts_with(prefix))
}

/// Every reference under `root` that does not resolve inside it, as `FILE:LINE: what`.
fn problems(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for file in checked_files(root) {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let base = file.parent().unwrap_or(root);
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        if shown == THIS_FILE {
            continue;
        }
        let markdown = file.extension().is_some_and(|extension| extension == "md");
        let rust = file.extension().is_some_and(|extension| extension == "rs");
        for (index, line) in text.lines().enumerate() {
            let mut report = |what: String| {
                problems.push(format!("{shown}:{}: {what}", index + 1));
            };
            if markdown {
                for target in markdown_link_targets(line) {
                    let path = target.split('#').next().unwrap_or("");
                    if target.contains("://") || target.starts_with("mailto:") || path.is_empty() {
                        continue;
                    }
                    if !resolves_inside(root, base, path) {
                        report(format!("link to {target} finds no file in the repository"));
                    }
                }
            }
            for word in path_words(line) {
                let leaves = OUTSIDE_PREFIXES
                    .iter()
                    .filter(|prefix| !(rust && **prefix == "../"))
                    .any(|prefix| word.starts_with(prefix));
                if leaves {
                    if !resolves_inside(root, base, word) {
                        report(format!("{word} points outside the repository"));
                    }
                } else if is_reference(word)
                    && !resolves_inside(root, root, word)
                    && !resolves_inside(root, base, word)
                {
                    report(format!("{word} is not a file in the repository"));
                }
            }
        }
    }
    problems
}

#[test]
fn every_link_and_path_in_the_repository_resolves_inside_it() {
    let root = repository_root();
    assert!(
        root.join("Cargo.toml").is_file() && root.join("README.md").is_file(),
        "the repository's root is not {}",
        root.display()
    );
    let found = problems(&root);
    assert!(
        found.is_empty(),
        "{} references do not resolve inside the repository (point them to a file in it, \
         e.g. docs/quota-shares.md or docs/cli.md):\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The checker finds each kind of broken reference, and passes the ones that resolve.
#[test]
fn the_checker_reports_links_and_paths_that_do_not_resolve() {
    let root = tempfile::tempdir().expect("a temporary directory");
    let root = root.path();
    fs::create_dir_all(root.join("docs")).unwrap();
    fs::create_dir_all(root.join("crate/src")).unwrap();
    fs::create_dir_all(root.join(".ci")).unwrap();
    fs::create_dir_all(root.join("target")).unwrap();
    fs::write(root.join("docs/cli.md"), "# cli\n").unwrap();
    // Written in pieces, so that this file holds none of the broken references itself.
    let outside = ["..", "/shared/spec/cli.md"].concat();
    let spec = ["spec", "/quota-shares.md"].concat();
    let design = ["DESIGN", ".md"].concat();
    fs::write(
        root.join("README.md"),
        format!(
            "See [the CLI](docs/cli.md#connecting), [home](https://example.org/x.md) and \
             [here](#words).\nThe contract is `{outside}`.\nBroken: [gone](docs/gone.md).\n\
             Fine: `docs/cli.md`, `docs/`, README.md.\n"
        ),
    )
    .unwrap();
    fs::write(
        root.join("crate/src/lib.rs"),
        format!(
            "//! The rules of {spec}; see {design} and ../../README.md.\n\
             const REFUSED: &str = \"../escape\"; // data, not a reference\n\
             // ../{design}\n"
        ),
    )
    .unwrap();
    fs::write(root.join(".ci/run"), "cat docs/missing.md\n").unwrap();
    fs::write(root.join("target/ignored.md"), "[x](nowhere.md)\n").unwrap();

    let found = problems(root);
    let expected = [
        ".ci/run:1: docs/missing.md is not a file in the repository".to_string(),
        format!("README.md:2: {outside} points outside the repository"),
        "README.md:3: link to docs/gone.md finds no file in the repository".to_string(),
        "README.md:3: docs/gone.md is not a file in the repository".to_string(),
        format!("crate/src/lib.rs:1: {spec} is not a file in the repository"),
        format!("crate/src/lib.rs:1: {design} is not a file in the repository"),
        format!("crate/src/lib.rs:3: ../{design} is not a file in the repository"),
    ];
    assert_eq!(found, expected);
}
