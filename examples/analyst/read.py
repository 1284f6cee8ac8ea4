#!/usr/bin/env python3
"""Read mailplane topics as an analyst: every record, read_committed.

    read.py --brokers 127.0.0.1:19092 --schemas http://127.0.0.1:8080 \
        [--topic mailplane.placement.decisions.v1 --topic mailplane.sync.audit.v1] \
        [--group analytics-me] [--namespace staging] [--timeout 60]

Needs Debian's python3-confluent-kafka and python3-jsonschema. Reads each
topic from its start to its end (the last stable offset: records of
aborted transactions are never delivered, and open ones are waited out),
decodes the CloudEvents binary-mode headers (ce_*; librdkafka undoes the
gzip batches), validates each value against the reader schema the API
serves at /v1/schemas/{ce_type} (MAILPLANE_API_TOKEN, when set, is sent as
the bearer token), and prints one JSON line per record, then a summary
line. Exit 1 when a record does not validate, 2 on a broker or API error.
It joins no group (partitions are assigned, nothing is committed): the
group id only names the client; analysts' own groups are analytics-*.
"""

import argparse
import json
import os
import sys
import time
import urllib.parse
import urllib.request

import jsonschema
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

DEFAULT_TOPICS = ["mailplane.placement.decisions.v1", "mailplane.sync.audit.v1"]
ATTRIBUTES = ("specversion", "id", "type", "source", "time", "subject", "dataschema")
SCHEMA_PREFIX = "urn:mailplane:schema:"


class Schemas:
    """Reader schemas by record type, fetched once each from the API."""

    def __init__(self, base, token):
        self.base = base.rstrip("/")
        self.token = token
        self.validators = {}

    def validator(self, record_type):
        if record_type not in self.validators:
            url = self.base + "/v1/schemas/" + urllib.parse.quote(record_type, safe="")
            req = urllib.request.Request(url)
            if self.token:
                req.add_header("Authorization", "Bearer " + self.token)
            with urllib.request.urlopen(req, timeout=10) as resp:
                schema = json.load(resp)
            self.validators[record_type] = jsonschema.Draft202012Validator(
                schema, format_checker=jsonschema.FormatChecker())
        return self.validators[record_type]


def headers_of(msg):
    """The record's headers as a dict: the first of a name counts."""
    out = {}
    for key, value in msg.headers() or []:
        if key not in out:
            out[key] = value.decode("utf-8") if value is not None else None
    return out


def decode(msg, schemas):
    """One record as a JSON-able dict, with its validation verdict."""
    h = headers_of(msg)
    rec = {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
           "key": msg.key().decode("utf-8") if msg.key() is not None else None}
    for a in ATTRIBUTES:
        rec[a] = h.get("ce_" + a)
    rec["extensions"] = {k[3:]: v for k, v in h.items()
                         if k.startswith("ce_") and k[3:] not in ATTRIBUTES}
    problems = []
    if rec["specversion"] != "1.0":
        problems.append("ce_specversion is %r, not 1.0" % rec["specversion"])
    ctype = (h.get("content-type") or "").split(";")[0].strip().lower()
    if ctype != "application/json":
        problems.append("content-type %r: not a binary-mode JSON record" % h.get("content-type"))
    if rec["dataschema"] != SCHEMA_PREFIX + (rec["type"] or ""):
        problems.append("ce_dataschema %r does not name the schema of ce_type" % rec["dataschema"])
    data = None
    if msg.value() is not None:
        try:
            data = json.loads(msg.value())
        except ValueError as e:
            problems.append("value is not JSON: %s" % e)
    if data is not None and rec["type"]:
        errs = sorted(schemas.validator(rec["type"]).iter_errors(data), key=lambda e: list(e.path))
        problems += ["%s: %s" % ("/".join(map(str, e.path)) or "(value)", e.message) for e in errs]
    rec["data"] = data
    rec["valid"] = not problems
    if problems:
        rec["problems"] = problems
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--schemas", required=True, help="mailplane API base URL (serves /v1/schemas/{type})")
    ap.add_argument("--topic", action="append", help="repeatable; default: the decision log and the audit topic")
    ap.add_argument("--group", default="analytics-read-py")
    ap.add_argument("--namespace", default="",
                    help="the deployment's MAILPLANE_KAFKA_NAMESPACE: prefixes the default topics and the group")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds to reach every partition's end")
    args = ap.parse_args()
    prefix = args.namespace + "." if args.namespace else ""
    topics = args.topic or [prefix + t for t in DEFAULT_TOPICS]
    schemas = Schemas(args.schemas, os.environ.get("MAILPLANE_API_TOKEN", ""))

    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": prefix + args.group,
        "isolation.level": "read_committed",  # librdkafka's default, said out loud
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    })
    try:
        meta = consumer.list_topics(timeout=10)
        assignment = []
        for t in topics:
            tm = meta.topics.get(t)
            if tm is None or tm.error is not None:
                print("read.py: topic %s: %s" % (t, tm.error if tm else "not found"), file=sys.stderr)
                return 2
            assignment += [TopicPartition(t, p, OFFSET_BEGINNING) for p in sorted(tm.partitions)]
        consumer.assign(assignment)
        pending = {(tp.topic, tp.partition) for tp in assignment}
        counts, invalid = {}, 0
        deadline = time.monotonic() + args.timeout
        while pending:
            if time.monotonic() > deadline:
                print("read.py: partitions not read to their end: %s" % sorted(pending), file=sys.stderr)
                return 2
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                    continue
                print("read.py: %s" % msg.error(), file=sys.stderr)
                return 2
            rec = decode(msg, schemas)
            counts[rec["topic"]] = counts.get(rec["topic"], 0) + 1
            invalid += not rec["valid"]
            print(json.dumps(rec, sort_keys=True))
        print(json.dumps({"summary": {"records": counts, "invalid": invalid}}, sort_keys=True))
        return 1 if invalid else 0
    finally:
        consumer.close()


if __name__ == "__main__":
    sys.exit(main())
