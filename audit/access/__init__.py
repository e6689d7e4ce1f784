"""Account audit: logins, logouts, failed logins, lockouts and their reset, and changes to users and
roles made through the admin. ``events`` records them (the services), ``receivers`` connects Django's
and django-axes' signals to it, ``admin`` is the audited User and Group admin."""
