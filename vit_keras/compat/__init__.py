"""The API of faustomorales/vit-keras, on this package's models: ``from vit_keras import vit, utils`` still works."""
