import sys

from django.core.management.base import BaseCommand

from audit.services import export_jsonl


class Command(BaseCommand):
    help = "Export the audit log as JSON Lines (stdout, or --output FILE)."

    def add_arguments(self, parser):
        parser.add_argument("--output", default="-")
        parser.add_argument("--since-seq", type=int, default=0)

    def handle(self, *args, output, since_seq, **opts):
        if output == "-":
            n = export_jsonl(sys.stdout, since_seq)
        else:
            with open(output, "w", encoding="utf-8") as fh:
                n = export_jsonl(fh, since_seq)
        self.stderr.write(f"exported {n} events")
