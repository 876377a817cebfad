"""The project's own downstream asset: loads every model ONES trained (its materialization's
``model_uri``) and measures it on the dataset's test split."""

import dagster as dg
import torch

from ones_example.data import load_split
from ones_pipeline.defs.component import trained_models
from ones_pipeline.defs.resources import MlflowResource


@dg.asset(deps=[dg.AssetKey("training_job"), dg.AssetKey("digits_dataset")], kinds={"pytorch", "mlflow"},
          description="Test accuracy of each trained model, loaded back from MLflow")
def model_accuracy(context: dg.AssetExecutionContext, mlflow: MlflowResource) -> dg.MaterializeResult:
    import mlflow as mlflow_lib

    mlflow_lib.set_tracking_uri(mlflow.tracking_uri)
    _, _, x_test, y_test = (torch.as_tensor(a) for a in load_split())
    accuracy = {}
    for job, meta in trained_models(context).items():
        if not meta.get("model_uri"):
            context.log.warning(f"{job}: no model in its materialization")
            continue
        model = mlflow_lib.pytorch.load_model(meta["model_uri"])
        with torch.no_grad():
            accuracy[job] = round(float((model(x_test).argmax(1) == y_test).float().mean()), 4)
        context.log.info(f"{job}: {meta['model_uri']} accuracy {accuracy[job]}")
    return dg.MaterializeResult(metadata={**{f"accuracy/{job}": v for job, v in accuracy.items()},
                                          "models": len(accuracy)})
