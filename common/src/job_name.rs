//! The name a job gets when it is submitted without one.
//!
//! A name is what people find a job by in `quotient job list`, so a job without `--name` is
//! not left nameless: it is named after what it runs, with a short suffix that tells apart
//! jobs of the same program, e.g. `train-k7x2q` for `python train.py` (Kubernetes'
//! `generateName` works the same way). The suffix comes from random bits that the caller
//! passes in, so this stays pure: the coordinators name a job at the edge, when the leader's
//! API takes the submit and before the command is proposed, never in the state machine,
//! which must give the same bytes on every replica.

use crate::JobSpec;

/// Letters of the suffix: consonants and digits without look-alikes (no vowels, so that no
/// suffix spells a word; no `0`/`o`, `1`/`l`, `3`/`e`), as Kubernetes picks them.
pub const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Characters in the suffix: 27^5, about 14 million suffixes per stem.
pub const SUFFIX_CHARS: usize = 5;
/// The longest stem kept, in bytes, so that a generated name is at most 54 bytes.
pub const STEM_BYTES_MAX: usize = 48;
/// The stem when nothing usable is left of the command or image.
pub const STEM_FALLBACK: &str = "job";
/// Programs that run a script given as their next argument: the script names the job better.
const LAUNCHERS: [&str; 11] = [
    "python", "python2", "python3", "sh", "bash", "zsh", "env", "node", "perl", "ruby", "uv",
];

/// The generated name of `spec`: its stem ([`stem`]), `-`, and [`SUFFIX_CHARS`] characters of
/// [`SUFFIX_ALPHABET`] drawn from `random_bits`. Always a valid job name.
pub fn generated_job_name(spec: &JobSpec, random_bits: u64) -> String {
    let mut bits = random_bits;
    let mut name = stem(spec);
    name.push('-');
    for _ in 0..SUFFIX_CHARS {
        let alphabet_len = SUFFIX_ALPHABET.len() as u64;
        name.push(char::from(SUFFIX_ALPHABET[(bits % alphabet_len) as usize]));
        bits /= alphabet_len;
    }
    name
}

/// What a generated name starts with: the file name of the program (`/opt/bin/train.sh` ->
/// `train`), or of the script a launcher such as `python` or `sh` runs when its next argument
/// is one (`python3 train.py` -> `train`); for an image without a command, the image's name
/// (`registry:5000/team/trainer:v2` -> `trainer`). The extension is dropped, characters a
/// name may not hold become `-`, and it is cut to [`STEM_BYTES_MAX`] bytes; [`STEM_FALLBACK`]
/// when nothing is left.
pub fn stem(spec: &JobSpec) -> String {
    let command = &spec.payload.command;
    let source = match command.first() {
        Some(program) => {
            let program_stem = file_stem(program);
            match command.get(1) {
                Some(script)
                    if LAUNCHERS.contains(&program_stem.as_str()) && !script.starts_with('-') =>
                {
                    file_stem(script)
                }
                _ => program_stem,
            }
        }
        None => spec
            .payload
            .image
            .as_deref()
            .map(image_name)
            .unwrap_or_default(),
    };
    let mut stem = String::new();
    for character in source.chars() {
        let keep = character.is_ascii_alphanumeric() || character == '_' || character == '-';
        let next = if keep { character } else { '-' };
        if next == '-' && (stem.is_empty() || stem.ends_with('-')) {
            continue;
        }
        stem.push(next);
        if stem.len() >= STEM_BYTES_MAX {
            break;
        }
    }
    let stem = stem.trim_end_matches('-');
    if stem.is_empty() {
        STEM_FALLBACK.to_string()
    } else {
        stem.to_string()
    }
}

/// The last path component of `path`, without what follows its first `.` (kept whole when
/// that would leave nothing, as for `.hidden`).
fn file_stem(path: &str) -> String {
    let file = path.rsplit('/').find(|part| !part.is_empty()).unwrap_or("");
    match file.split_once('.') {
        Some((before, _)) if !before.is_empty() => before.to_string(),
        _ => file.to_string(),
    }
}

/// The repository's last component of an image reference, without registry, tag or digest.
fn image_name(image: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or("");
    let last = without_digest.rsplit('/').next().unwrap_or("");
    last.split(':').next().unwrap_or("").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::validate_name;
    use crate::JobPayload;

    fn spec(command: &[&str], image: Option<&str>) -> JobSpec {
        let mut spec = JobSpec::new(
            "qs1",
            0,
            1,
            command.iter().map(|part| part.to_string()).collect(),
        );
        spec.payload.image = image.map(str::to_string);
        spec
    }

    #[test]
    fn the_stem_names_the_program_or_the_script_it_runs() {
        // Proves the stem rules: file name without directory and extension, the script of a
        // launcher, the image's name, and a fallback when nothing usable is left.
        assert_eq!(stem(&spec(&["/opt/bin/train.sh"], None)), "train");
        assert_eq!(
            stem(&spec(&["python3", "train.py", "--lr", "3"], None)),
            "train"
        );
        assert_eq!(stem(&spec(&["python", "-m", "pkg.train"], None)), "python");
        assert_eq!(stem(&spec(&["sh", "-c", "echo hi"], None)), "sh");
        assert_eq!(stem(&spec(&["torchrun", "train.py"], None)), "torchrun");
        assert_eq!(stem(&spec(&["./run me!"], None)), "run-me");
        assert_eq!(stem(&spec(&[".hidden"], None)), "hidden");
        assert_eq!(stem(&spec(&["/"], None)), STEM_FALLBACK);
        assert_eq!(stem(&spec(&["日本語"], None)), STEM_FALLBACK);
        assert_eq!(stem(&spec(&["ünï"], None)), "n");
        let image = |reference| stem(&spec(&[], Some(reference)));
        assert_eq!(image("registry:5000/team/trainer:v2"), "trainer");
        assert_eq!(image("busybox@sha256:abc"), "busybox");
        assert_eq!(image("nvcr.io/nvidia/pytorch:24.01-py3"), "pytorch");
        let long = "a".repeat(300);
        assert_eq!(stem(&spec(&[&long], None)).len(), STEM_BYTES_MAX);
    }

    #[test]
    fn a_generated_name_is_the_stem_and_a_suffix_of_the_bits() {
        // Proves the form `STEM-XXXXX`, that different bits give different suffixes, and
        // that the same bits give the same name (the function is pure).
        let job = spec(&["/opt/train.sh"], None);
        let name = generated_job_name(&job, 0);
        assert_eq!(name, "train-bbbbb");
        let other = generated_job_name(&job, 1);
        assert_eq!(other, "train-cbbbb");
        assert_eq!(
            generated_job_name(&job, 12_345),
            generated_job_name(&job, 12_345)
        );
        let suffix = &generated_job_name(&job, u64::MAX)["train-".len()..];
        assert_eq!(suffix.len(), SUFFIX_CHARS);
        assert!(suffix.bytes().all(|byte| SUFFIX_ALPHABET.contains(&byte)));
    }

    #[test]
    fn every_generated_name_is_a_valid_job_name() {
        // Proves that whatever a command or image holds (any bytes a job spec allows, up to
        // its length limit), the generated name passes the name rule, so a spec with it
        // still validates.
        let awkward = [
            "",
            "-",
            "..",
            "a b/c.d",
            "日本語.py",
            "--flag",
            "x:y@z",
            "//////",
            "_-_",
        ];
        for (index, text) in awkward.iter().enumerate() {
            for job in [
                spec(&[text], None),
                spec(&["python", text], None),
                spec(&[], Some(text)),
            ] {
                let name = generated_job_name(&job, index as u64 * 7_919);
                assert_eq!(validate_name("job", &name), Ok(()), "{text:?}: {name}");
                let mut named = job.clone();
                named.name = Some(name);
                named.payload = JobPayload {
                    image: Some("image".into()),
                    command: crate::Args::new(),
                };
                assert_eq!(named.validate(), Ok(()), "{text:?}");
            }
        }
        let longest = "x".repeat(crate::job::FIELD_BYTES_MAX);
        let name = generated_job_name(&spec(&[&longest], None), u64::MAX);
        assert_eq!(validate_name("job", &name), Ok(()));
    }
}
