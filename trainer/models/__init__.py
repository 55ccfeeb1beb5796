"""The ranking model and the EasyRec model classes built from its parts."""
