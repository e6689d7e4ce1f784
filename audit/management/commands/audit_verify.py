import json

from django.core.management.base import BaseCommand, CommandError

from audit.services import verify_chain


class Command(BaseCommand):
    help = "Verify the audit hash chain; names the first broken link (edited, deleted, inserted or reordered)."

    def handle(self, *args, **opts):
        report = verify_chain()
        self.stdout.write(json.dumps(report.as_dict()))
        if not report.ok:
            raise CommandError(
                f"audit chain broken at seq {report.first_broken_seq}: {report.problem} ({report.detail})"
            )
