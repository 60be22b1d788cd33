"""Every environment variable the runtime reads, and what it is for: the one list an operator reads and the
deploy files are held to (tests/system/test_deploy.py checks that every variable a manifest or compose file
sets for an `sa` container is listed here, and that every name listed is read somewhere in `runtime/`).

Pure data with no imports, so any floor may read it. A constant naming a variable
(`runtime.nats.topology.ENV_REPLICAS`, `runtime.log.payloads.ENV_THRESHOLD`) stays beside the code that
reads it.
"""

ENV_VARS: dict[str, str] = {
    "NATS_URL": "NATS server URL(s), comma-separated (every `sa` command; unset: `sa up` starts one)",
    "SA_REPLICAS": "stream and bucket replicas when the topology is created or updated (3 on a 3-node "
                  "cluster); unset: keep what the streams have, 1 for new ones",
    "SA_PAYLOAD_THRESHOLD": "size above which tool outputs, model responses and task inputs go to the "
                            "object store (default 256kb; runtime.log.payloads)",
    "SA_EVENTS_MAX_AGE": "`sa host`/`sa up`: how long EVENTS keeps an event (default 90d; 0: no bound; "
                         "runtime.nats.retention)",
    "SA_EVENTS_MAX_BYTES": "`sa host`/`sa up`: EVENTS size bound, oldest events dropped first "
                           "(default: none)",
    "SA_PAYLOADS_MAX_AGE": "`sa host`/`sa up`: how long the payloads object store keeps an object "
                           "(default 90d)",
    "SA_PAYLOADS_MAX_BYTES": "`sa host`/`sa up`: payloads object store size bound (default: none)",
    "SA_LOCAL_MODEL_URL": "`sa host`: the model server for bundles whose model is `local`",
    "SA_SANDBOX_WORKERS": "sandbox processes per `sa worker`/host (default: the CPU count, at least 2)",
    "NATS_CREDS": "NATS credentials file (user JWT + seed) for every `sa` command (--creds; "
                  "runtime.nats.credentials)",
    "NATS_USER": "NATS user name, a role of deploy/nats/auth.conf or `sa up --secure` (--user)",
    "NATS_PASSWORD": "password of NATS_USER (--password)",
    "NATS_CA": "CA certificate (PEM) that verifies the NATS server's TLS certificate (--tls-ca)",
    "NATS_CERT": "client TLS certificate (PEM) for servers that verify clients (--tls-cert)",
    "NATS_KEY": "key of NATS_CERT (--tls-key)",
    "OPENAI_BASE_URL": "model client default base URL when a bundle names none",
    "OPENAI_API_KEY": "model client default API key",
    "OPENAI_MODEL": "model client default model name",
    "SA_MODEL_HTTP": "how model calls travel: `direct` (default, runtime.model.wire) or `httpx` (the plain "
                     "openai SDK, a fallback)",
}

__all__ = ["ENV_VARS"]
