import json

from django.core.management.base import BaseCommand, CommandError

from audit.integrity import failures, verify_all


class Command(BaseCommand):
    help = (
        "Verify the audit hash chain, every run's history chain and the effect ledger against the "
        "history, in one snapshot; with --anchors also every signed anchor. Names the first broken "
        "position of each; exits non-zero if anything is broken."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--anchors",
            action="store_true",
            help="also check every anchor's signature and that its (seq, hash) is still in the DB",
        )

    def handle(self, *args, anchors, **opts):
        report = verify_all(anchors=anchors)
        self.stdout.write(json.dumps(report))
        if not report["ok"]:
            raise CommandError("; ".join(failures(report)))
