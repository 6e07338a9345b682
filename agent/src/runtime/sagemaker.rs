//! SageMaker's training contract, for a job submitted through the AWS Batch–compatible
//! endpoint (docs/aws-batch.md): the coordinators put what the container needs in the job's
//! `QUOTIENT_SAGEMAKER` variable ([`Contract`]); the Docker runtime gives the container the
//! files and variables an unmodified SageMaker training image reads, as the public
//! sagemaker-training-toolkit does:
//!
//! - `/opt/ml/input/config/hyperparameters.json`, `resourceconfig.json` (`current_host`,
//!   `hosts`, `network_interface_name`...), `inputdataconfig.json`, and one empty
//!   `/opt/ml/input/data/CHANNEL` per channel (the data itself is the job's to fetch: an on-prem
//!   fleet has no S3 to copy it from);
//! - `/opt/ml/model`, `/opt/ml/output` (and `output/data`), and the checkpoint dir at
//!   `CheckpointConfig.LocalPath` (`/opt/ml/checkpoints` by default);
//! - `SM_*` variables: `SM_HOSTS`, `SM_CURRENT_HOST`, `SM_NUM_GPUS`, `SM_MODEL_DIR`, `SM_HPS`,
//!   `SM_HP_*`, `SM_CHANNELS`, `SM_CHANNEL_*`, `SM_MASTER_ADDR`, `SM_MASTER_PORT`...;
//! - hosts named `algo-1`, `algo-2`... in rank order, resolvable in the container.
//!
//! On the host, the input and output dirs are in the attempt's work dir; the model dir and the
//! checkpoints are in the job's checkpoint dir (`model/`, `checkpoints/`), which outlives
//! attempts and is shared between nodes where the checkpoint root is. When the container
//! exits with a failure and wrote `/opt/ml/output/failure`, its text is the attempt's reason
//! ([`failure_reason`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use quotient_common::job_report::EXIT_REASON_BYTES_MAX;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{give_to, real_dir_for, JobUser, LaunchSpec, RuntimeError};

/// The job variable that makes a job a SageMaker training job.
pub const CONTRACT_ENV: &str = "QUOTIENT_SAGEMAKER";
/// Where SageMaker's files live in the container.
pub const OPT_ML: &str = "/opt/ml";
/// The network interface name `resourceconfig.json` gives, as SageMaker's.
pub const NETWORK_INTERFACE: &str = "eth0";

/// What the coordinators passed in [`CONTRACT_ENV`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Contract {
    pub job_name: String,
    pub instance_type: String,
    /// `ContainerEntrypoint`; `None`: the image's own.
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub hyperparameters: BTreeMap<String, String>,
    /// `inputdataconfig.json`'s content: channel name to its settings.
    #[serde(default)]
    pub input_data_config: Map<String, Value>,
    /// Where the checkpoint dir is mounted.
    pub checkpoint_path: String,
}

/// What the runtime adds to the container for the contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub env: BTreeMap<String, String>,
    /// `HOST:CONTAINER` binds.
    pub binds: Vec<String>,
    pub entrypoint: Option<Vec<String>>,
    /// `algo-N:ADDRESS` entries for the container's `/etc/hosts`.
    pub extra_hosts: Vec<String>,
    /// The container's host name (`algo-N`), unless it shares the host's network.
    pub hostname: Option<String>,
}

/// The contract of `spec`, if it is a SageMaker job.
pub fn contract(spec: &LaunchSpec) -> Result<Option<Contract>, String> {
    let Some(text) = spec.env.get(CONTRACT_ENV) else {
        return Ok(None);
    };
    let contract: Contract = serde_json::from_str(text)
        .map_err(|error| format!("{CONTRACT_ENV} is not a SageMaker training contract: {error}"))?;
    if !contract.checkpoint_path.starts_with('/') || contract.checkpoint_path.contains("..") {
        return Err(format!(
            "CheckpointConfig.LocalPath {:?} must be an absolute path",
            contract.checkpoint_path
        ));
    }
    for channel in contract.input_data_config.keys() {
        if channel.is_empty()
            || !channel
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "channel name {channel:?} must be letters, digits, '-' and '_'"
            ));
        }
    }
    Ok(Some(contract))
}

/// The host dir of the attempt's `/opt/ml/input` and `/opt/ml/output`.
pub fn attempt_dir(work_dir: &Path) -> PathBuf {
    work_dir.join("sagemaker")
}

fn host_name(rank: usize) -> String {
    format!("algo-{}", rank + 1)
}

/// Writes `value` to `path`, a new file (never through a link left there), the job user's.
fn write_json(path: &Path, value: &Value, user: &JobUser) -> Result<(), RuntimeError> {
    use std::io::Write;
    let text = serde_json::to_string_pretty(value).expect("JSON values encode");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|error| RuntimeError::io("write", path, error))?;
    give_to(path, user)
}

/// Writes the contract's files for `spec` (whose work dir and checkpoint dir the caller made)
/// and says what to give the container.
pub fn prepare(
    spec: &LaunchSpec,
    contract: &Contract,
    user: &JobUser,
) -> Result<Prepared, RuntimeError> {
    let meet = &spec.rendezvous;
    let hosts: Vec<String> = (0..meet.hosts.len().max(1)).map(host_name).collect();
    let current = host_name(meet.rank as usize);
    let root = attempt_dir(&spec.work_dir);
    let (input, output) = (root.join("input"), root.join("output"));
    let config = input.join("config");
    // Each directory on its own, parents first, never through a link: the checkpoint dir is
    // the job's to write and outlives its attempts, so a link to a host directory left there
    // as `model` would otherwise be handed to the job and mounted into its container.
    let data = input.join("data");
    for dir in [&root, &input, &config, &data, &output, &output.join("data")] {
        real_dir_for(dir, user)?;
    }
    for channel in contract.input_data_config.keys() {
        real_dir_for(&data.join(channel), user)?;
    }
    let model = spec.checkpoint_dir.join("model");
    let checkpoints = spec.checkpoint_dir.join("checkpoints");
    real_dir_for(&model, user)?;
    real_dir_for(&checkpoints, user)?;
    let resource_config = json!({
        "current_host": current,
        "current_instance_type": contract.instance_type,
        "current_group_name": "homogeneousCluster",
        "hosts": hosts,
        "instance_groups": [{
            "instance_group_name": "homogeneousCluster",
            "instance_type": contract.instance_type,
            "hosts": hosts,
        }],
        "network_interface_name": NETWORK_INTERFACE,
    });
    let hyperparameters = json!(contract.hyperparameters);
    let input_data_config = Value::Object(contract.input_data_config.clone());
    write_json(&config.join("hyperparameters.json"), &hyperparameters, user)?;
    write_json(&config.join("resourceconfig.json"), &resource_config, user)?;
    write_json(
        &config.join("inputdataconfig.json"),
        &input_data_config,
        user,
    )?;

    let channels: Vec<&String> = contract.input_data_config.keys().collect();
    let mut env = BTreeMap::from([
        ("SM_HOSTS".to_string(), json!(hosts).to_string()),
        ("SM_CURRENT_HOST".to_string(), current.clone()),
        (
            "SM_CURRENT_INSTANCE_TYPE".to_string(),
            contract.instance_type.clone(),
        ),
        (
            "SM_NETWORK_INTERFACE_NAME".to_string(),
            NETWORK_INTERFACE.to_string(),
        ),
        (
            "SM_NUM_GPUS".to_string(),
            spec.gpu_indices.len().to_string(),
        ),
        ("SM_NUM_CPUS".to_string(), cpus(spec).to_string()),
        ("SM_HPS".to_string(), hyperparameters.to_string()),
        ("SM_CHANNELS".to_string(), json!(channels).to_string()),
        (
            "SM_INPUT_DATA_CONFIG".to_string(),
            input_data_config.to_string(),
        ),
        (
            "SM_RESOURCE_CONFIG".to_string(),
            resource_config.to_string(),
        ),
        ("SM_MODEL_DIR".to_string(), format!("{OPT_ML}/model")),
        ("SM_INPUT_DIR".to_string(), format!("{OPT_ML}/input")),
        (
            "SM_INPUT_CONFIG_DIR".to_string(),
            format!("{OPT_ML}/input/config"),
        ),
        ("SM_OUTPUT_DIR".to_string(), format!("{OPT_ML}/output")),
        (
            "SM_OUTPUT_DATA_DIR".to_string(),
            format!("{OPT_ML}/output/data"),
        ),
        (
            "SM_CHECKPOINT_DIR".to_string(),
            contract.checkpoint_path.clone(),
        ),
        ("SM_MASTER_ADDR".to_string(), host_name(0)),
        ("SM_MASTER_PORT".to_string(), meet.master_port.to_string()),
        (
            "SM_TRAINING_JOB_NAME".to_string(),
            contract.job_name.clone(),
        ),
        ("TRAINING_JOB_NAME".to_string(), contract.job_name.clone()),
        ("SM_LOG_LEVEL".to_string(), "20".to_string()),
    ]);
    for channel in &channels {
        env.insert(
            format!("SM_CHANNEL_{}", channel.to_uppercase().replace('-', "_")),
            format!("{OPT_ML}/input/data/{channel}"),
        );
    }
    for (name, value) in &contract.hyperparameters {
        let key = format!("SM_HP_{}", name.to_uppercase());
        if key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            env.insert(key, value.clone());
        }
    }
    let training_env = json!({
        "job_name": contract.job_name,
        "hosts": hosts,
        "current_host": current,
        "num_gpus": spec.gpu_indices.len(),
        "hyperparameters": hyperparameters,
        "channel_input_dirs": channels.iter().map(|c| (c.to_string(), json!(format!("{OPT_ML}/input/data/{c}")))).collect::<Map<_, _>>(),
        "model_dir": format!("{OPT_ML}/model"),
        "output_dir": format!("{OPT_ML}/output"),
        "output_data_dir": format!("{OPT_ML}/output/data"),
        "input_dir": format!("{OPT_ML}/input"),
        "input_config_dir": format!("{OPT_ML}/input/config"),
        "master_hostname": host_name(0),
        "network_interface_name": NETWORK_INTERFACE,
    });
    env.insert("SM_TRAINING_ENV".to_string(), training_env.to_string());

    let binds = vec![
        format!("{}:{OPT_ML}/input", input.display()),
        format!("{}:{OPT_ML}/output", output.display()),
        format!("{}:{OPT_ML}/model", model.display()),
        format!("{}:{}", checkpoints.display(), contract.checkpoint_path),
    ];
    // Every member by its SageMaker name; on the host's network (several nodes) the names
    // point at the hosts, else the container itself is algo-1.
    let extra_hosts = if meet.is_gang() {
        meet.hosts
            .iter()
            .enumerate()
            .map(|(rank, address)| format!("{}:{address}", host_name(rank)))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Prepared {
        env,
        binds,
        entrypoint: contract.entrypoint.clone(),
        extra_hosts,
        hostname: (!meet.is_gang()).then_some(current),
    })
}

/// The CPUs the attempt may use, rounded up; 1 when it has no limit of its own.
fn cpus(spec: &LaunchSpec) -> u64 {
    spec.limits
        .nano_cpus()
        .map_or(1, |nano| (nano as u64).div_ceil(1_000_000_000).max(1))
}

/// The text the attempt in `work_dir` left in `/opt/ml/output/failure`, at most
/// [`EXIT_REASON_BYTES_MAX`] bytes of it, if it left any.
pub fn failure_reason(work_dir: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = attempt_dir(work_dir).join("output").join("failure");
    // The job's own file, read by root: never through a link (which could name any file of
    // the host, whose first bytes would become the job's reason), and a FIFO neither blocks
    // the open nor is read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(EXIT_REASON_BYTES_MAX as u64 * 4)
        .read_to_end(&mut bytes)
        .ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut cut = text.len().min(EXIT_REASON_BYTES_MAX);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Some(text[..cut].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{JobLimits, Rendezvous};
    use quotient_common::{JobId, JobPayload, Signal};

    fn spec(dir: &Path, contract: &str, rendezvous: Rendezvous) -> LaunchSpec {
        LaunchSpec {
            job: JobId(9),
            attempt: 1,
            payload: JobPayload {
                image: Some("img:1".into()),
                command: ["train"].into(),
            },
            env: BTreeMap::from([(CONTRACT_ENV.to_string(), contract.to_string())]),
            gpu_indices: vec![0, 1],
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            checkpoint_dir: dir.join("checkpoints/j-9"),
            work_dir: dir.join("work/j-9-1"),
            log_path: dir.join("logs/j-9-1.log"),
            checkpoint_signal: Signal::Sigterm,
            grace_period_ms: 1_000,
            limits: JobLimits::NONE,
            rendezvous,
        }
    }

    const CONTRACT: &str = r#"{"job_name": "t", "instance_type": "ml.g5.12xlarge",
        "entrypoint": ["python", "train.py"], "hyperparameters": {"epochs": "3", "lr": "0.1"},
        "input_data_config": {"train": {"TrainingInputMode": "File"}},
        "checkpoint_path": "/opt/ml/checkpoints"}"#;

    fn read(path: PathBuf) -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn a_member_of_two_nodes_gets_the_files_variables_and_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let meet = Rendezvous {
            rank: 1,
            hosts: vec!["10.0.0.1".into(), "10.0.0.2".into()],
            master_addr: "10.0.0.1".into(),
            master_port: 29_700,
        };
        let spec = spec(dir.path(), CONTRACT, meet);
        let contract = contract(&spec).unwrap().unwrap();
        std::fs::create_dir_all(&spec.work_dir).unwrap();
        std::fs::create_dir_all(&spec.checkpoint_dir).unwrap();
        let prepared = prepare(&spec, &contract, &JobUser::current()).unwrap();
        let config = attempt_dir(&spec.work_dir).join("input/config");
        assert_eq!(
            read(config.join("hyperparameters.json")),
            json!({"epochs": "3", "lr": "0.1"})
        );
        let resources = read(config.join("resourceconfig.json"));
        assert_eq!(resources["current_host"], "algo-2");
        assert_eq!(resources["hosts"], json!(["algo-1", "algo-2"]));
        assert_eq!(resources["network_interface_name"], "eth0");
        assert_eq!(
            read(config.join("inputdataconfig.json")),
            json!({"train": {"TrainingInputMode": "File"}})
        );
        assert!(attempt_dir(&spec.work_dir)
            .join("input/data/train")
            .is_dir());
        assert!(spec.checkpoint_dir.join("model").is_dir());
        let env = &prepared.env;
        assert_eq!(env["SM_CURRENT_HOST"], "algo-2");
        assert_eq!(env["SM_HOSTS"], r#"["algo-1","algo-2"]"#);
        assert_eq!(env["SM_NUM_GPUS"], "2");
        assert_eq!(env["SM_HP_EPOCHS"], "3");
        assert_eq!(env["SM_CHANNEL_TRAIN"], "/opt/ml/input/data/train");
        assert_eq!(env["SM_MASTER_ADDR"], "algo-1");
        assert_eq!(env["SM_MASTER_PORT"], "29700");
        assert_eq!(env["SM_MODEL_DIR"], "/opt/ml/model");
        assert_eq!(
            prepared.extra_hosts,
            vec!["algo-1:10.0.0.1".to_string(), "algo-2:10.0.0.2".to_string()]
        );
        // On the hosts' network the container keeps the host's name.
        assert_eq!(prepared.hostname, None);
        assert_eq!(
            prepared.entrypoint,
            Some(vec!["python".to_string(), "train.py".to_string()])
        );
        let model = spec.checkpoint_dir.join("model");
        assert!(prepared
            .binds
            .contains(&format!("{}:/opt/ml/model", model.display())));
        let checkpoints = spec.checkpoint_dir.join("checkpoints");
        assert!(prepared
            .binds
            .contains(&format!("{}:/opt/ml/checkpoints", checkpoints.display())));
    }

    #[test]
    fn a_link_the_job_left_in_its_checkpoint_dir_is_replaced_not_followed() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path(), CONTRACT, Rendezvous::single(None, 29_500));
        let contract = contract(&spec).unwrap().unwrap();
        std::fs::create_dir_all(&spec.work_dir).unwrap();
        // A host directory the job must not get, and the job's links to it from its
        // checkpoint dir (which outlives attempts) and from its fresh work dir.
        let host = dir.path().join("host-dir");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::create_dir_all(&spec.checkpoint_dir).unwrap();
        std::os::unix::fs::symlink(&host, spec.checkpoint_dir.join("model")).unwrap();
        std::fs::write(spec.checkpoint_dir.join("checkpoints"), "a file").unwrap();
        std::os::unix::fs::symlink(&host, attempt_dir(&spec.work_dir)).unwrap();
        // As root (CI), the job user is another one, so a followed link would show as a
        // change of the host directory's owner.
        let root = unsafe { libc::geteuid() } == 0;
        let user = if root {
            JobUser {
                name: "nobody".into(),
                uid: 65_534,
                gid: 65_534,
                per_job: false,
            }
        } else {
            JobUser::current()
        };
        let before = std::fs::metadata(&host).unwrap().uid();
        prepare(&spec, &contract, &user).unwrap();
        for made in [
            spec.checkpoint_dir.join("model"),
            spec.checkpoint_dir.join("checkpoints"),
            attempt_dir(&spec.work_dir),
        ] {
            let meta = std::fs::symlink_metadata(&made).unwrap();
            assert!(meta.file_type().is_dir(), "{}", made.display());
            assert_eq!(meta.uid(), user.uid, "{}", made.display());
        }
        assert_eq!(std::fs::metadata(&host).unwrap().uid(), before);
        assert_eq!(
            std::fs::read_dir(&host).unwrap().count(),
            0,
            "nothing written there"
        );
    }

    #[test]
    fn a_job_of_one_node_is_algo_1() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path(), CONTRACT, Rendezvous::single(None, 29_500));
        let contract = contract(&spec).unwrap().unwrap();
        std::fs::create_dir_all(&spec.work_dir).unwrap();
        std::fs::create_dir_all(&spec.checkpoint_dir).unwrap();
        let prepared = prepare(&spec, &contract, &JobUser::current()).unwrap();
        assert_eq!(prepared.hostname.as_deref(), Some("algo-1"));
        assert!(prepared.extra_hosts.is_empty());
    }

    #[test]
    fn bad_contracts_are_refused_and_other_jobs_have_none() {
        let dir = tempfile::tempdir().unwrap();
        let plain = LaunchSpec {
            env: BTreeMap::new(),
            ..spec(dir.path(), CONTRACT, Rendezvous::default())
        };
        assert_eq!(contract(&plain).unwrap(), None);
        let relative = CONTRACT.replace("/opt/ml/checkpoints", "ckpt");
        let refused = contract(&spec(dir.path(), &relative, Rendezvous::default()));
        assert!(refused.unwrap_err().contains("absolute"));
        let channel = CONTRACT.replace("\"train\"", "\"../x\"");
        let refused = contract(&spec(dir.path(), &channel, Rendezvous::default()));
        assert!(refused.unwrap_err().contains("channel name"));
        assert!(contract(&spec(dir.path(), "{", Rendezvous::default())).is_err());
    }

    #[test]
    fn the_failure_file_is_the_reason_cut_to_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        assert_eq!(failure_reason(&work), None);
        let output = attempt_dir(&work).join("output");
        std::fs::create_dir_all(&output).unwrap();
        std::fs::write(output.join("failure"), "  out of memory\n").unwrap();
        assert_eq!(failure_reason(&work).as_deref(), Some("out of memory"));
        std::fs::write(output.join("failure"), "é".repeat(EXIT_REASON_BYTES_MAX)).unwrap();
        let cut = failure_reason(&work).unwrap();
        assert!(cut.len() <= EXIT_REASON_BYTES_MAX && cut.starts_with('é'));
        std::fs::write(output.join("failure"), "\n").unwrap();
        assert_eq!(failure_reason(&work), None);
        // A link the job left there is not followed, whatever it names.
        let secret = work.join("secret");
        std::fs::write(&secret, "host secret").unwrap();
        std::fs::remove_file(output.join("failure")).unwrap();
        std::os::unix::fs::symlink(&secret, output.join("failure")).unwrap();
        assert_eq!(failure_reason(&work), None);
    }
}
