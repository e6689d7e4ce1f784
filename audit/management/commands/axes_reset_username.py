from axes.management.commands.axes_reset_username import Command as AxesCommand

from ._axes_reset import reset_and_report


class Command(AxesCommand):
    help = "Reset all access attempts and lockouts for given usernames (audited)"

    def handle(self, *args, **options):
        for username in options["username"]:
            reset_and_report(self, "axes_reset_username", username=username)
