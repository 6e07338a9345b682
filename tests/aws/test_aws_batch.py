"""The AWS Batch-compatible endpoint, driven by real AWS clients: boto3 and the AWS CLI.

Run by `cargo test -p quotient-tests --test aws_batch`, which starts a dev cluster (its agents
run containers on this host's Docker engine) and runs this file with the virtual environment's
Python (`.ci/run` makes it: boto3 and awscli from PyPI). It needs:

    QUOTIENT_BIN        the quotient executable
    QUOTIENT_CONFIG     the dev cluster's client.toml (an admin certificate)
    QUOTIENT_DEV_DIR    the dev cluster's folder (cluster.json, certs/, checkpoints/)
    QUOTIENT_TEST_IMAGE the image the jobs run (busybox, built offline)
    AWS_CLI             the `aws` executable of the virtual environment

The tests run in order (unittest sorts them by name): setup through the AWS guide's steps,
then the launch walkthrough, then the rest.
"""

import http.client
import json
import os
import socket
import ssl
import subprocess
import time
import unittest

import boto3
import botocore.config
import botocore.exceptions

QUOTIENT = os.environ["QUOTIENT_BIN"]
DEV_DIR = os.environ["QUOTIENT_DEV_DIR"]
IMAGE = os.environ.get("QUOTIENT_TEST_IMAGE", "quotient-test-busybox:latest")
AWS_CLI = os.environ.get("AWS_CLI", "aws")
CA = os.path.join(DEV_DIR, "certs", "ca.pem")
REGION = "us-east-1"
# A job that stops at once (exit 0) when it gets its checkpoint signal.
SLEEPER = "trap 'exit 0' TERM; while true; do sleep 1; done"


def quotient(*args):
    out = subprocess.run([QUOTIENT, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError(f"quotient {args} failed: {out.stderr}{out.stdout}")
    return out.stdout


def endpoints():
    with open(os.path.join(DEV_DIR, "cluster.json")) as f:
        cluster = json.load(f)
    return [c["aws_endpoint"] for c in cluster["coordinators"]]


def new_key(user, admin=False):
    args = ["access-key", "create", "--user", user, "-o", "json"]
    if admin:
        args.append("--admin")
    return json.loads(quotient(*args))


def batch(key, endpoint=None, secret=None):
    return boto3.client(
        "batch",
        endpoint_url=endpoint or endpoints()[0],
        region_name=REGION,
        aws_access_key_id=key["access_key_id"],
        aws_secret_access_key=secret or key["secret_access_key"],
        verify=CA,
        config=botocore.config.Config(retries={"max_attempts": 8, "mode": "standard"}),
    )


def payload(name, entrypoint=None, arguments=None, hyperparameters=None, instance="ml.g5.xlarge", **extra):
    algorithm = {"TrainingImage": IMAGE, "TrainingInputMode": "File"}
    if entrypoint is not None:
        algorithm["ContainerEntrypoint"] = entrypoint
    if arguments is not None:
        algorithm["ContainerArguments"] = arguments
    request = {
        "TrainingJobName": name,
        "AlgorithmSpecification": algorithm,
        "RoleArn": "arn:aws:iam::000000000000:role/unused-on-prem",
        "ResourceConfig": {"InstanceType": instance, "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "OutputDataConfig": {"S3OutputPath": "s3://unused/"},
        "HyperParameters": hyperparameters or {},
    }
    request.update(extra)
    return json.dumps(request)


def wait_status(client, job_id, statuses, timeout=60):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = client.describe_service_job(jobId=job_id)
        if last["status"] in statuses:
            return last
        time.sleep(0.3)
    raise AssertionError(f"{job_id} is not {statuses} after {timeout} s: {last}")


class AwsBatch(unittest.TestCase):
    """State shared by the ordered tests."""

    admin_key = None
    alice_key = None
    jobs = {}

    @classmethod
    def setUpClass(cls):
        cls.admin_key = new_key("admin", admin=True)
        cls.alice_key = new_key("alice")
        cls.admin = batch(cls.admin_key)
        # alice talks to a follower as often as to the leader: the endpoint forwards.
        cls.alice = batch(cls.alice_key, endpoint=endpoints()[1])

    def submit(self, client, name, share, priority, **kwargs):
        body = dict(
            jobName=name,
            jobQueue="q1",
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName=share,
            schedulingPriority=priority,
            serviceRequestPayload=payload(name, entrypoint=["sh", "-c"], arguments=[SLEEPER]),
        )
        body.update(kwargs)
        answer = client.submit_service_job(**body)
        self.assertEqual(answer["jobName"], name)
        return answer["jobId"]

    def test_1_setup_steps_of_the_aws_guide(self):
        policy = self.admin.create_scheduling_policy(
            name="qsp", quotaSharePolicy={"idleResourceAssignmentStrategy": "FIFO"}
        )
        environment = self.admin.create_service_environment(
            serviceEnvironmentName="se1",
            serviceEnvironmentType="SAGEMAKER_TRAINING",
            capacityLimits=[{"maxCapacity": 3, "capacityUnit": "ml.g5.xlarge"}],
        )
        self.admin.create_job_queue(
            jobQueueName="q1",
            priority=1,
            jobQueueType="SAGEMAKER_TRAINING",
            schedulingPolicyArn=policy["arn"],
            serviceEnvironmentOrder=[
                {"order": 1, "serviceEnvironment": environment["serviceEnvironmentArn"]}
            ],
        )
        queues = self.admin.describe_job_queues(jobQueues=["q1"])["jobQueues"]
        self.assertEqual([q["jobQueueName"] for q in queues], ["q1"])
        self.assertEqual(queues[0]["schedulingPolicyArn"], policy["arn"])
        envs = self.admin.describe_service_environments()["serviceEnvironments"]
        self.assertEqual(envs[0]["capacityLimits"][0]["capacityUnit"], "ml.g5.xlarge")
        shares = [
            ("QS1", {"strategy": "LEND_AND_BORROW", "borrowLimit": 200}, "ENABLED"),
            ("QS2", {"strategy": "LEND"}, "DISABLED"),
            ("QS3", {"strategy": "RESERVE"}, "DISABLED"),
        ]
        for name, sharing, preemption in shares:
            self.admin.create_quota_share(
                quotaShareName=name,
                jobQueue="q1",
                capacityLimits=[{"maxCapacity": 1, "capacityUnit": "ml.g5.xlarge"}],
                resourceSharingConfiguration=sharing,
                preemptionConfiguration={"inSharePreemption": preemption},
                tags={"team": name.lower()},
            )
        qs1 = self.admin.describe_quota_share(quotaShareArn="QS1")
        self.assertEqual(qs1["resourceSharingConfiguration"], {"strategy": "LEND_AND_BORROW", "borrowLimit": 200})
        self.assertEqual(qs1["capacityLimits"], [{"maxCapacity": 1, "capacityUnit": "ml.g5.xlarge"}])
        self.assertEqual(qs1["tags"], {"team": "qs1"})
        # The same share, as the command line sees it: 1 GPU of the instance type's class.
        share = json.loads(quotient("share", "get", "QS1", "-o", "json"))
        self.assertEqual(share["limits"], {"a10g": 1})
        self.assertEqual(share["strategy"], "lend-and-borrow")
        self.assertEqual(share["borrow_limit_percent"], 200)
        # QS3 admits only its members: alice is not one.
        quotient("share", "update", "QS3", "--add-member", "carol")

    def test_2_walkthrough_three_jobs_into_qs1(self):
        jobs = self.jobs
        jobs["high"] = self.submit(self.alice, "high", "QS1", 3, tags={"project": "llm"})
        jobs["med"] = self.submit(self.alice, "med", "QS1", 2)
        jobs["low"] = self.submit(self.alice, "low", "QS1", 1)
        high = wait_status(self.alice, jobs["high"], ["RUNNING"])
        self.assertEqual(high["tags"], {"project": "llm"})
        self.assertEqual(high["capacityUsage"], [{"capacityUnit": "ml.g5.xlarge", "quantity": 1.0}])
        self.assertIn("startedAt", high)
        wait_status(self.alice, jobs["med"], ["RUNNING"])
        low = wait_status(self.alice, jobs["low"], ["RUNNABLE"])
        self.assertEqual(low["quotaShareName"], "QS1")
        self.assertEqual(low["schedulingPriority"], 1)
        self.assertEqual(low["preemptionSummary"]["preemptedAttemptCount"], 0)
        time.sleep(2)
        self.assertEqual(self.alice.describe_service_job(jobId=jobs["low"])["status"], "RUNNABLE")

    def test_3_walkthrough_a_late_job_into_qs2_reclaims(self):
        jobs = self.jobs
        jobs["qs2"] = self.submit(self.admin, "qs2-job", "QS2", 1)
        wait_status(self.admin, jobs["qs2"], ["RUNNING"])
        med = wait_status(self.alice, jobs["med"], ["RUNNABLE"])
        summary = med["preemptionSummary"]
        self.assertEqual(summary["preemptedAttemptCount"], 1)
        self.assertEqual(len(summary["recentPreemptedAttempts"]), 1)
        attempt = summary["recentPreemptedAttempts"][0]
        self.assertIn("preempted", attempt["statusReason"])
        self.assertIn("startedAt", attempt)
        self.assertIn("stoppedAt", attempt)
        self.assertEqual(self.alice.describe_service_job(jobId=jobs["high"])["status"], "RUNNING")

    def test_4_walkthrough_a_priority_raise_preempts_in_share(self):
        jobs = self.jobs
        answer = self.alice.update_service_job(jobId=jobs["low"], schedulingPriority=4)
        self.assertEqual(answer["jobId"], jobs["low"])
        low = wait_status(self.alice, jobs["low"], ["RUNNING"])
        self.assertEqual(low["schedulingPriority"], 4)
        high = wait_status(self.alice, jobs["high"], ["RUNNABLE"])
        self.assertEqual(high["preemptionSummary"]["preemptedAttemptCount"], 1)
        self.assertEqual(self.admin.describe_service_job(jobId=jobs["qs2"])["status"], "RUNNING")
        self.assertEqual(len(high["attempts"]), 1)
        self.assertTrue(high["attempts"][0]["serviceResourceId"]["value"].startswith("arn:aws:sagemaker:"))

    def test_5_list_service_jobs_pages_and_filters(self):
        jobs = self.jobs
        pages = self.admin.get_paginator("list_service_jobs").paginate(
            jobQueue="q1", PaginationConfig={"PageSize": 2}
        )
        seen = [job["jobId"] for page in pages for job in page["jobSummaryList"]]
        self.assertEqual(sorted(seen), sorted(jobs.values()))
        self.assertEqual(len(seen), len(set(seen)))
        # Newest first.
        self.assertEqual(seen, sorted(seen, key=lambda j: int(j[2:]), reverse=True))

        def ids(**kwargs):
            listed = self.admin.list_service_jobs(jobQueue="q1", **kwargs)["jobSummaryList"]
            return sorted(job["jobId"] for job in listed)

        name = lambda value: [{"name": "JOB_NAME", "values": [value]}]
        self.assertEqual(ids(filters=name("HIGH")), [jobs["high"]])
        self.assertEqual(ids(filters=name("qs2*")), [jobs["qs2"]])
        share = lambda value: [{"name": "QUOTA_SHARE_NAME", "values": [value]}]
        self.assertEqual(ids(filters=share("QS2")), [jobs["qs2"]])
        self.assertEqual(ids(filters=share("QS1"), jobStatus="RUNNABLE"), sorted([jobs["high"], jobs["med"]]))
        self.assertEqual(ids(jobStatus="RUNNING"), sorted([jobs["low"], jobs["qs2"]]))
        self.assertEqual(ids(jobStatus="SUCCEEDED"), [])
        created = self.admin.describe_service_job(jobId=jobs["med"])["createdAt"]
        after = ids(filters=[{"name": "AFTER_CREATED_AT", "values": [str(created)]}])
        self.assertEqual(after, sorted([jobs["low"], jobs["qs2"]]))
        before = ids(filters=[{"name": "BEFORE_CREATED_AT", "values": [str(created)]}])
        self.assertEqual(before, [jobs["high"]])
        self.assertEqual(ids(filters=[{"name": "SHARE_IDENTIFIER", "values": ["none"]}]), [])
        # Alice sees her own jobs through a follower.
        mine = self.alice.list_service_jobs(jobQueue="q1", filters=share("QS1"))["jobSummaryList"]
        self.assertEqual(len(mine), 3)

    def test_6_a_client_token_makes_a_submit_idempotent(self):
        first = self.submit(self.alice, "tokened", "QS1", 0, clientToken="token-123")
        again = self.submit(self.alice, "tokened", "QS1", 0, clientToken="token-123")
        self.assertEqual(first, again)
        listed = self.admin.list_service_jobs(jobQueue="q1", filters=[{"name": "JOB_NAME", "values": ["tokened"]}])
        self.assertEqual([job["jobId"] for job in listed["jobSummaryList"]], [first])
        self.alice.terminate_service_job(jobId=first, reason="done with it")
        stopped = wait_status(self.alice, first, ["FAILED"])
        self.assertTrue(stopped["isTerminated"])

    def test_7_refusals(self):
        def code(call):
            with self.assertRaises(botocore.exceptions.ClientError) as caught:
                call()
            return caught.exception.response["Error"]["Code"]

        wrong = batch(self.alice_key, secret="x" * 40)
        self.assertEqual(code(lambda: wrong.list_quota_shares(jobQueue="q1")), "InvalidSignatureException")
        unknown = batch({"access_key_id": "AKQTNOSUCHKEY0000000", "secret_access_key": "y" * 40})
        self.assertEqual(code(lambda: unknown.list_quota_shares(jobQueue="q1")), "UnrecognizedClientException")
        before = len(self.admin.list_service_jobs(jobQueue="q1")["jobSummaryList"])
        refused = code(lambda: self.submit(self.alice, "not-a-member", "QS3", 1))
        self.assertEqual(refused, "AccessDeniedException")
        # A user key may not make shares.
        self.assertEqual(
            code(
                lambda: self.alice.create_quota_share(
                    quotaShareName="QS9",
                    jobQueue="q1",
                    capacityLimits=[{"maxCapacity": 1, "capacityUnit": "ml.g5.xlarge"}],
                    resourceSharingConfiguration={"strategy": "RESERVE"},
                    preemptionConfiguration={"inSharePreemption": "DISABLED"},
                )
            ),
            "AccessDeniedException",
        )
        self.assertEqual(code(lambda: self.admin.describe_compute_environments()), "UnknownOperationException")
        # A nextToken this endpoint never gave is refused, not taken as a place to start.
        self.assertEqual(code(lambda: self.admin.list_quota_shares(jobQueue="q1", nextToken="../\u0000garbage")), "ClientException")
        self.assertEqual(code(lambda: self.admin.describe_job_queues(nextToken=" ")), "ClientException")
        self.assertEqual(code(lambda: self.admin.submit_service_job(
            jobName="bad", jobQueue="q1", serviceJobType="SAGEMAKER_TRAINING", quotaShareName="QS1",
            serviceRequestPayload=payload("bad", instance="ml.nope.xlarge"))), "ClientException")
        # Nothing was written by any of them.
        self.assertEqual(len(self.admin.list_service_jobs(jobQueue="q1")["jobSummaryList"]), before)
        self.assertNotIn("QS9", quotient("share", "list"))

    def test_7b_connections_are_limited_in_number_and_time(self):
        """No client, signed or not, can hold the endpoint's connections: headers that never
        end are cut off, one address gets at most 128 connections (the next is closed unread,
        while other addresses are served), and a body over the limit gets an AWS error."""
        host, port = endpoints()[0].removeprefix("https://").rsplit(":", 1)
        port = int(port)
        tls = ssl.create_default_context(cafile=CA)
        started = time.monotonic()
        slow = tls.wrap_socket(
            socket.create_connection((host, port), timeout=30, source_address=("127.0.0.2", 0)),
            server_hostname=host,
        )
        slow.sendall(b"POST /v1/listquotashares HTTP/1.1\r\nHost: x\r\n")

        def closed(sock):
            try:
                return sock.recv(1) == b""
            except (ConnectionError, ssl.SSLError):
                return True

        held = [socket.create_connection((host, port), source_address=("127.0.0.3", 0)) for _ in range(128)]
        try:
            extra = socket.create_connection((host, port), timeout=5, source_address=("127.0.0.3", 0))
            self.assertTrue(closed(extra), "a 129th connection from one address was served")
            extra.close()
            # Another address is served meanwhile.
            self.admin.list_quota_shares(jobQueue="q1")
        finally:
            for sock in held:
                sock.close()

        with self.assertRaises(botocore.exceptions.ClientError) as caught:
            self.admin.submit_service_job(
                jobName="huge", jobQueue="q1", serviceJobType="SAGEMAKER_TRAINING", quotaShareName="QS1",
                serviceRequestPayload="x" * (300 * 1024))
        self.assertEqual(caught.exception.response["Error"]["Code"], "ClientException")
        self.assertEqual(caught.exception.response["ResponseMetadata"]["HTTPStatusCode"], 413)

        # A chunked body over the limit (no length declared) is cut off with the same error.
        chunked = http.client.HTTPSConnection(host, port, context=tls, timeout=30)
        chunked.request("POST", "/v1/listquotashares", body=iter([b"x" * 65536] * 5), encode_chunked=True)
        answer = chunked.getresponse()
        self.assertEqual(answer.status, 413)
        self.assertEqual(answer.getheader("x-amzn-ErrorType"), "ClientException")
        chunked.close()

        self.assertTrue(closed(slow), "headers that never ended held their connection")
        self.assertLess(time.monotonic() - started, 25)
        slow.close()

    def test_8_the_aws_cli_lists_quota_shares(self):
        env = dict(os.environ)
        env.update(
            AWS_ACCESS_KEY_ID=self.admin_key["access_key_id"],
            AWS_SECRET_ACCESS_KEY=self.admin_key["secret_access_key"],
            AWS_DEFAULT_REGION=REGION,
            AWS_CA_BUNDLE=CA,
        )
        out = subprocess.run(
            [AWS_CLI, "batch", "list-quota-shares", "--job-queue", "q1", "--endpoint-url", endpoints()[2], "--output", "json"],
            capture_output=True,
            text=True,
            env=env,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        names = sorted(share["quotaShareName"] for share in json.loads(out.stdout)["quotaShares"])
        self.assertEqual(names, ["QS1", "QS2", "QS3"])

    def test_9_a_container_gets_the_sagemaker_training_contract(self):
        # QS3's GPU is idle; carol, a member, submits there.
        carol = batch(new_key("carol"), endpoint=endpoints()[2])
        script = (
            "set -e; "
            "cp /opt/ml/input/config/hyperparameters.json /opt/ml/model/hyperparameters.json; "
            "cp /opt/ml/input/config/resourceconfig.json /opt/ml/model/resourceconfig.json; "
            "cp /opt/ml/input/config/inputdataconfig.json /opt/ml/model/inputdataconfig.json; "
            "env | grep '^SM_' | sort > /opt/ml/model/env.txt; "
            "test -d /opt/ml/input/data/train; "
            "echo saved > /opt/ml/checkpoints/step-1; "
            "echo \"epochs must be at most 10, got $SM_HP_EPOCHS\" > /opt/ml/output/failure; "
            "exit 3"
        )
        job = carol.submit_service_job(
            jobName="contract",
            jobQueue="q1",
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName="QS3",
            schedulingPriority=1,
            serviceRequestPayload=payload(
                "contract-training",
                entrypoint=["sh", "-c"],
                arguments=[script],
                hyperparameters={"epochs": "12", "lr": "0.1"},
                InputDataConfig=[{"ChannelName": "train", "DataSource": {"S3DataSource": {"S3Uri": "s3://unused/", "S3DataType": "S3Prefix"}}}],
                CheckpointConfig={"S3Uri": "s3://unused/", "LocalPath": "/opt/ml/checkpoints"},
                Environment={"MY_SETTING": "on"},
            ),
        )["jobId"]
        failed = wait_status(carol, job, ["FAILED", "SUCCEEDED"], timeout=90)
        self.assertEqual(failed["status"], "FAILED", failed)
        self.assertIn("epochs must be at most 10, got 12", failed["statusReason"])
        self.assertIn("exited with code 3", failed["statusReason"])
        # What the container wrote, in the job's checkpoint dir on the host.
        job_dir = os.path.join(DEV_DIR, "checkpoints", job)
        model = os.path.join(job_dir, "model")
        with open(os.path.join(model, "hyperparameters.json")) as f:
            self.assertEqual(json.load(f), {"epochs": "12", "lr": "0.1"})
        with open(os.path.join(model, "resourceconfig.json")) as f:
            resources = json.load(f)
        self.assertEqual(resources["current_host"], "algo-1")
        self.assertEqual(resources["hosts"], ["algo-1"])
        self.assertEqual(resources["network_interface_name"], "eth0")
        with open(os.path.join(model, "inputdataconfig.json")) as f:
            self.assertIn("train", json.load(f))
        with open(os.path.join(model, "env.txt")) as f:
            env = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
        self.assertEqual(env["SM_CURRENT_HOST"], "algo-1")
        self.assertEqual(json.loads(env["SM_HOSTS"]), ["algo-1"])
        self.assertEqual(env["SM_NUM_GPUS"], "1")
        self.assertEqual(env["SM_MODEL_DIR"], "/opt/ml/model")
        self.assertEqual(json.loads(env["SM_HPS"]), {"epochs": "12", "lr": "0.1"})
        self.assertEqual(env["SM_HP_EPOCHS"], "12")
        self.assertEqual(env["SM_CHANNEL_TRAIN"], "/opt/ml/input/data/train")
        self.assertEqual(env["SM_MASTER_ADDR"], "algo-1")
        self.assertIn("SM_MASTER_PORT", env)
        with open(os.path.join(job_dir, "checkpoints", "step-1")) as f:
            self.assertEqual(f.read(), "saved\n")
        # Without an entrypoint, the image runs with the argument `train`, as SageMaker runs
        # it; ContainerArguments alone replace it. This one succeeds.
        ok = carol.submit_service_job(
            jobName="succeeds",
            jobQueue="q1",
            serviceJobType="SAGEMAKER_TRAINING",
            quotaShareName="QS3",
            serviceRequestPayload=payload("succeeds", arguments=["true"]),
        )["jobId"]
        done = wait_status(carol, ok, ["SUCCEEDED", "FAILED"], timeout=90)
        self.assertEqual(done["status"], "SUCCEEDED", done)
        self.assertIn("stoppedAt", done)

    def test_9b_a_quota_share_is_updated_disabled_and_deleted(self):
        self.admin.create_quota_share(
            quotaShareName="QS4",
            jobQueue="q1",
            capacityLimits=[{"maxCapacity": 1, "capacityUnit": "ml.g5.12xlarge"}],
            resourceSharingConfiguration={"strategy": "RESERVE"},
            preemptionConfiguration={"inSharePreemption": "DISABLED"},
        )
        self.assertEqual(json.loads(quotient("share", "get", "QS4", "-o", "json"))["limits"], {"a10g": 4})
        self.admin.update_quota_share(
            quotaShareArn="arn:aws:batch:us-east-1:000000000000:quota-share/QS4",
            capacityLimits=[{"maxCapacity": 2, "capacityUnit": "ml.g5.xlarge"}],
            resourceSharingConfiguration={"strategy": "LEND_AND_BORROW", "borrowLimit": 50},
            preemptionConfiguration={"inSharePreemption": "ENABLED"},
        )
        qs4 = self.admin.describe_quota_share(quotaShareArn="QS4")
        self.assertEqual(qs4["capacityLimits"], [{"maxCapacity": 2, "capacityUnit": "ml.g5.xlarge"}])
        self.assertEqual(qs4["resourceSharingConfiguration"], {"strategy": "LEND_AND_BORROW", "borrowLimit": 50})
        self.assertEqual(qs4["preemptionConfiguration"], {"inSharePreemption": "ENABLED"})
        # A borrow limit belongs to LEND_AND_BORROW alone, in an update as in a create.
        with self.assertRaises(botocore.exceptions.ClientError) as caught:
            self.admin.update_quota_share(
                quotaShareArn="QS4", resourceSharingConfiguration={"strategy": "LEND", "borrowLimit": 50})
        self.assertIn("only to the LEND_AND_BORROW", caught.exception.response["Error"]["Message"])
        self.assertEqual(self.admin.describe_quota_share(quotaShareArn="QS4")["resourceSharingConfiguration"],
                         {"strategy": "LEND_AND_BORROW", "borrowLimit": 50})
        # As on the command line, an enabled share is not deleted.
        with self.assertRaises(botocore.exceptions.ClientError) as caught:
            self.admin.delete_quota_share(quotaShareArn="QS4")
        self.assertIn("disable it", caught.exception.response["Error"]["Message"])
        self.admin.update_quota_share(quotaShareArn="QS4", state="DISABLED")
        self.assertEqual(self.admin.describe_quota_share(quotaShareArn="QS4")["state"], "DISABLED")
        self.admin.delete_quota_share(quotaShareArn="QS4")
        listed = self.admin.list_quota_shares(jobQueue="q1")["quotaShares"]
        self.assertEqual(sorted(share["quotaShareName"] for share in listed), ["QS1", "QS2", "QS3"])
        pages = self.admin.get_paginator("list_quota_shares").paginate(jobQueue="q1", PaginationConfig={"PageSize": 1})
        self.assertEqual([s["quotaShareName"] for page in pages for s in page["quotaShares"]], ["QS1", "QS2", "QS3"])
        policies = self.admin.describe_scheduling_policies(arns=["qsp"])["schedulingPolicies"]
        self.assertEqual(policies[0]["quotaSharePolicy"], {"idleResourceAssignmentStrategy": "FIFO"})

    def test_9c_terminate_several_jobs(self):
        jobs = self.jobs
        answer = self.admin.terminate_service_jobs(jobs=[jobs["high"], jobs["med"], "j-999999"], reason="the end")
        self.assertEqual(sorted(answer["successful"]), sorted([jobs["high"], jobs["med"]]))
        self.assertEqual([error["job"] for error in answer["errors"]], ["j-999999"])
        for name in ("high", "med"):
            ended = wait_status(self.admin, jobs[name], ["FAILED"])
            self.assertTrue(ended["isTerminated"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
