from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("town", "0011_run_temperature_default"),
    ]

    operations = [
        migrations.AddField(
            model_name="decision",
            name="priority",
            field=models.IntegerField(
                blank=True, help_text="The engine's scheduling class (lower goes first).", null=True
            ),
        ),
    ]
