from axes.management.commands.axes_reset import Command as AxesCommand

from ._axes_reset import reset_and_report


class Command(AxesCommand):
    help = "Reset all access attempts and lockouts (audited)"

    def handle(self, *args, **options):
        reset_and_report(self, "axes_reset")
